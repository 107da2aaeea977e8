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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from transformers import PreTrainedModel

from inference_worker.model_geometry import ModelGeometry
from inference_worker.restore.loader import RestoreStats
from inference_worker.restore.planner import RestoreCosts, RestorePlan, plan_restore, plan_storage
from inference_worker.restore.profiler import restore_costs
from inference_worker.restore.settings import RestoreSettings
from inference_worker.restore.storage_plan import HiddenStatesNotSmaller, StoragePlan, hidden_pays_off

CALIBRATION_WEIGHT = 0.5  # of a restore's measured cost against the one planned on


@dataclass
class RestorePolicy:
    costs: RestoreCosts
    storage: StoragePlan
    chunk_tokens: int = 0  # the restores' chunks, projected one by one (0: a layer at a time)

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
        storage = plan_storage(
            costs,
            geometry.num_layers,
            settings.plan_tier,
            settings.plan_tokens,
            hidden_allowed=True,
            chunk_tokens=chunk_tokens,
        )
        return cls(costs, storage, chunk_tokens)

    def plan(self, tier: str, tokens: int) -> RestorePlan:
        """The fastest restore of a `tokens`-token prefix read from `tier`."""
        return plan_restore(self.costs, self.storage, tier, tokens, chunk_tokens=self.chunk_tokens)

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
