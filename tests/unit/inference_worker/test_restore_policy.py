"""The restore policy built at start: profiled costs are positive, grouped-query models keep
KV (and "on" refuses them), "off" keeps KV, and each request's plan is never slower
(modelled) than recomputing everything; finished restores calibrate the costs."""

from __future__ import annotations

import pytest

from inference_worker.restore.loader import RestoreStats
from inference_worker.restore.planner import RestoreCosts, RestorePlan, TierCosts, restore_seconds
from inference_worker.restore.policy import RestorePolicy
from inference_worker.restore.settings import RestoreSettings
from inference_worker.restore.storage_plan import HiddenStatesNotSmaller, StoragePlan

PROFILE = {"profile_tokens": (16, 64)}


def test_a_gqa_model_keeps_kv(tiny_llama) -> None:
    policy = RestorePolicy.create(tiny_llama, RestoreSettings(**PROFILE), element_bytes=4)
    assert policy.storage == StoragePlan.all_kv(3)
    assert policy.costs.project_seconds > 0 and policy.costs.recompute_seconds > 0
    with pytest.raises(HiddenStatesNotSmaller):
        RestorePolicy.create(tiny_llama, RestoreSettings(hidden_states="on", **PROFILE), element_bytes=4)


def test_off_keeps_kv_for_an_mha_model(tiny_llama_factory) -> None:
    mha = tiny_llama_factory(num_key_value_heads=4)
    policy = RestorePolicy.create(mha, RestoreSettings(hidden_states="off", **PROFILE), element_bytes=4)
    assert policy.storage.is_kv


@pytest.mark.parametrize("tier", ["dram", "ssd"])
def test_an_mha_models_plan_beats_recomputation(tiny_llama_factory, tier: str) -> None:
    mha = tiny_llama_factory(num_key_value_heads=4)
    # 1 kB/s: far slower than recomputing a tiny model however loaded the machine (at 1 MB/s a
    # profile on a busy 2-core CI machine once made loading the cheaper plan)
    settings = RestoreSettings(ssd_read_bytes_per_second=1e3, **PROFILE)
    policy = RestorePolicy.create(mha, settings, element_bytes=4)
    plan = policy.plan(tier, 512)
    assert plan.estimated_seconds <= restore_seconds(policy.costs, tier, 512, 3, 0, 0)
    if tier == "ssd":
        assert plan.recompute_layers > 0


def test_restores_calibrate_the_compute_costs_the_next_plans_use() -> None:
    # Planned on a projection of 1 us per token and layer, a hidden-state restore that took
    # 200 us: the policy moves towards it and soon recomputes those layers (50 us) instead.
    io = TierCosts(kv_seconds=10e-6, hidden_seconds=5e-6)
    costs = RestoreCosts(1e-6, 50e-6, 0.0, {"ssd": io})
    storage = StoragePlan(4, 0, 2)
    policy = RestorePolicy(costs, storage)
    first = policy.plan("ssd", 1000)
    assert first.hidden_layers == 2
    for _ in range(4):
        stats = RestoreStats(first, 1000, seconds={"recompute": 0.0, "hidden": 2 * 1000 * 200e-6, "kv": 0.0})
        policy.observe(stats)
    assert 150e-6 < policy.costs.project_seconds < 200e-6
    assert policy.costs.recompute_seconds == 50e-6  # nothing recomputed: no evidence
    assert policy.plan("ssd", 1000).recompute_layers == 2
    recomputed = RestorePlan.of(storage, 2)
    policy.observe(
        RestoreStats(recomputed, 1000, seconds={"recompute": 2 * 1000 * 100e-6, "hidden": 0.0, "kv": 0.0})
    )
    assert policy.costs.recompute_seconds == pytest.approx(75e-6)  # halfway to the measured 100 us
