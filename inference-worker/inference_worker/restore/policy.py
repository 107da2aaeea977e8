"""A worker's restore policy, built once at start: the costs profiled on its model, the
storage plan its namespaces save under, and the plan of each restore.

    RestorePolicy.create(model, settings) ──> storage  (the plan chunks are saved under)
                                          ──> plan(tier, tokens)  (per request)
                                          <── observe(stats)  (each finished restore)

Calibration: the start-up profile is a second's sample of a machine whose load changes (on
the shared development CPU a projection measured at start was off by up to 5x a few minutes
later), so each finished restore's own compute times (the compute thread's, per layer and
token) move the projection and recomputation costs towards what the executor really took;
later requests are planned on those. The storage plan, fixed per namespace, stays.

Probe: a cost learnt from earlier restores is still minutes old, and the machine's compute
swings 2.6x within minutes (bench-restore, load 8.5: planned on a 71 us projection median,
the restore then projected at 26-27 us and took 1.45x the best single method's time). So
where the plan depends on the compute cost (the plans with all compute `PROBE_SWING` times
dearer and cheaper differ), `plan` can time one projection of `probe_tokens` tokens now
(profiler.projection_probe, ~4 ms at 128 tokens of a 12 x 768 model) and plan on the costs
scaled to it; elsewhere (a fast tier: KV loading whatever the compute) it plans without.
Off by default: on the shared 2-core CPU it made plans worse (docs/hidden-states.md).
The restore itself cannot change course once its reads began: each stored layer has one
form, and the reads start above the recomputed layers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from transformers import PreTrainedModel

from inference_worker.model_geometry import ModelGeometry
from inference_worker.restore.loader import RestoreStats
from inference_worker.restore.planner import RestoreCosts, RestorePlan, plan_restore, plan_storage
from inference_worker.restore.profiler import projection_probe, restore_costs
from inference_worker.restore.settings import RestoreSettings
from inference_worker.restore.storage_plan import HiddenStatesNotSmaller, StoragePlan, hidden_pays_off

CALIBRATION_WEIGHT = 0.5  # of a restore's measured cost against the one planned on
PROBE_SWING = 3.0  # compute cost swings a plan is checked against before probing (2.6x seen)


@dataclass
class RestorePolicy:
    costs: RestoreCosts
    storage: StoragePlan
    chunk_tokens: int = 0  # the restores' chunks, projected one by one (0: a layer at a time)
    probe: Callable[[], float] | None = None  # a projection's seconds per token and layer now
    probe_max_age_seconds: float = 0.0
    probed: tuple[float, float] | None = None  # (monotonic time, seconds) of the last probe

    @classmethod
    def create(
        cls, model: PreTrainedModel, settings: RestoreSettings, element_bytes: int, chunk_tokens: int = 0
    ) -> RestorePolicy:
        """Profiles the model (a second or so on a CPU) and chooses the storage plan."""
        geometry = ModelGeometry.of(model.config)
        hidden_size = int(model.config.hidden_size)
        smaller = hidden_pays_off(geometry, hidden_size)
        if settings.hidden_states == "on" and not smaller:
            raise HiddenStatesNotSmaller(
                f"hidden states ({hidden_size} per token per layer) are not smaller than K and V here: "
                "set hidden_states to auto or off"
            )
        short, long = settings.profile_tokens
        costs = restore_costs(
            model, settings.tier_bytes_per_second(), element_bytes, short_tokens=short, long_tokens=long
        )
        if settings.hidden_states == "off" or not smaller:  # grouped-query models keep KV
            return cls(costs, StoragePlan.all_kv(geometry.num_layers), chunk_tokens)
        probe = projection_probe(model, settings.probe_tokens) if settings.probe_tokens else None
        storage = plan_storage(
            costs,
            geometry.num_layers,
            settings.plan_tier,
            settings.plan_tokens,
            hidden_allowed=True,
            chunk_tokens=chunk_tokens,
        )
        return cls(costs, storage, chunk_tokens, probe, settings.probe_max_age_seconds)

    def plan(self, tier: str, tokens: int) -> RestorePlan:
        """The fastest restore of a `tokens`-token prefix read from `tier`, on the compute
        costs probed now where the plan depends on them (module docstring)."""
        costs = self.costs
        if self.probe is not None and self._compute_decides(tier, tokens):
            costs = costs.compute_scaled(self._probe() / costs.project_seconds)
        return plan_restore(costs, self.storage, tier, tokens, chunk_tokens=self.chunk_tokens)

    def _compute_decides(self, tier: str, tokens: int) -> bool:
        names = {
            plan_restore(
                self.costs.compute_scaled(factor), self.storage, tier, tokens, chunk_tokens=self.chunk_tokens
            ).name
            for factor in (1 / PROBE_SWING, PROBE_SWING)
        }
        return len(names) > 1

    def _probe(self) -> float:
        """The probe's seconds, timed again if the last is older than `probe_max_age_seconds`."""
        now = time.monotonic()
        if self.probed is None or now - self.probed[0] > self.probe_max_age_seconds:
            self.probed = (now, self.probe())  # type: ignore[misc]  -- plan() checked it
        return self.probed[1]

    def observe(self, stats: RestoreStats) -> None:
        """Moves the compute costs towards those `stats` measured (module docstring)."""
        plan, costs, tokens = stats.plan, self.costs, stats.tokens
        if tokens <= 0:
            return
        project, recompute, pair = (
            costs.project_seconds,
            costs.recompute_seconds,
            costs.recompute_pair_seconds,
        )
        if plan.hidden_layers and stats.seconds["hidden"] > 0:
            measured = stats.seconds["hidden"] / (plan.hidden_layers * tokens)
            project += CALIBRATION_WEIGHT * (measured - project)
        modelled = plan.recompute_layers * costs.recompute_layer_seconds(tokens)
        if modelled > 0 and stats.seconds["recompute"] > 0:  # both parts scaled alike
            scale = 1 + CALIBRATION_WEIGHT * (stats.seconds["recompute"] / modelled - 1)
            recompute, pair = recompute * scale, pair * scale
        self.costs = dataclasses.replace(
            costs, project_seconds=project, recompute_seconds=recompute, recompute_pair_seconds=pair
        )


def worker_policy(
    model: PreTrainedModel, settings: RestoreSettings, element_bytes: int, chunk_tokens: int = 0
) -> RestorePolicy | None:
    """The worker's policy where its storage plan is not all KV; None otherwise (the classic
    KV path, decided without profiling when hidden states are off or do not pay)."""
    geometry = ModelGeometry.of(model.config)
    if settings.hidden_states == "off" or (
        settings.hidden_states == "auto" and not hidden_pays_off(geometry, int(model.config.hidden_size))
    ):
        return None
    policy = RestorePolicy.create(model, settings, element_bytes, chunk_tokens)
    return None if policy.storage.is_kv else policy
