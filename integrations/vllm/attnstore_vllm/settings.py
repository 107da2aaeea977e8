"""The connector's settings: vLLM's `kv_connector_extra_config`, validated once at start."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MiB = 1024 * 1024


class ConnectorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    daemon: str = Field(min_length=1, description="the attnstore daemon's gRPC address, host:port")
    chunk_tokens: int = Field(256, gt=0, description="tokens per chunk; a multiple of vLLM's block size")
    model_digest: str = Field(
        "",
        description="names the model in the namespace; the attnstore worker's digest of the same "
        "files makes the two share chunks; empty: derived from vLLM's model config",
    )
    tenant: str = Field("", description="isolation salt of every request without its own")
    use_shm: bool = Field(True, description="move chunk bytes through the daemon's shared memory")
    shm_dir: str = Field(
        "", description="where this process sees the daemon's arena directory, when mounted elsewhere"
    )
    lookup_timeout_seconds: float = Field(1.0, gt=0, description="bounds the scheduler's Lookup")
    layer_timeout_seconds: float = Field(10.0, gt=0, description="the longest a layer waits for its KV")
    rpc_timeout_seconds: float = Field(10.0, gt=0, description="bounds every other daemon call")
    max_pending_save_bytes: int = Field(
        256 * MiB, gt=0, description="chunk bytes waiting to be put; beyond it new saves are dropped"
    )

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> ConnectorSettings:
        return cls.model_validate(extra or {})


TENANT_PARAM = "attnstore_tenant"  # a request's kv_transfer_params key naming its tenant


def kv_transfer_config(settings: ConnectorSettings) -> dict[str, Any]:
    """vLLM's `kv_transfer_config` that loads this connector with the fields set on
    `settings` (validated here, not first in vLLM's processes)."""
    return {
        "kv_connector": "AttnStoreConnector",
        "kv_connector_module_path": "attnstore_vllm.connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": settings.model_dump(exclude_unset=True),
    }
