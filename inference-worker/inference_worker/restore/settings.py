"""Settings of restoring KV from hidden states (HCache): a nested model of the worker's
settings would carry them (`ATTNSTORE_WORKER_RESTORE__*`); each default written here once."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

GB = 1e9


class RestoreSettings(BaseModel):
    hidden_states: Literal["auto", "on", "off"] = Field(
        "auto",
        description="store hidden states where the storage plan says so: auto = only for models whose hidden "
        "states are smaller than K and V (multi-head attention; off for grouped-query models like SmolLM2), "
        "on = the same but an error on a model where they are not, off = KV only",
    )
    plan_tier: Literal["dram", "ssd"] = Field(
        "dram", description="the tier the storage plan is chosen for (where restores are expected to read)"
    )
    plan_tokens: int = Field(2048, ge=1, description="history length the storage plan is chosen for")
    dram_read_bytes_per_second: float = Field(
        8 * GB, gt=0, description="read bandwidth of the daemon's DRAM tier"
    )
    ssd_read_bytes_per_second: float = Field(
        2 * GB, gt=0, description="read bandwidth of the daemon's SSD tier"
    )
    profile_tokens: tuple[int, int] = Field(
        (256, 1024), description="the two history lengths a layer's recomputation is timed at, at start"
    )

    probe_tokens: int = Field(
        0,
        ge=0,
        description="tokens of a projection timed at plan time to rescale the compute costs (0 = no probe: "
        "on the shared 2-core CPU a probe on the event loop's thread slowed the next restore 1.2-2x and "
        "one sample swung 70-307 us; docs/hidden-states.md)",
    )
    probe_max_age_seconds: float = Field(
        1.0, ge=0, description="a plan-time probe younger than this is reused instead of timed again"
    )

    def tier_bytes_per_second(self) -> dict[str, float]:
        return {"dram": self.dram_read_bytes_per_second, "ssd": self.ssd_read_bytes_per_second}
