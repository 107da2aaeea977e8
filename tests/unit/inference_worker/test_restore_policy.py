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


# A slow tier where only compute decides how many of 4 hidden-state layers to recompute
# rather than read: reads 100 us per token and layer, projection 10 us, recomputation 60 us.
SLOW = {"slow": TierCosts(kv_seconds=200e-6, hidden_seconds=100e-6)}
ALL_HIDDEN = StoragePlan(4, 0, 4)


def probed_policy(probes: list[float], max_age_seconds: float = 0.0) -> tuple[RestorePolicy, list[float]]:
    """A policy whose probe answers `probes` in turn; the list of those it answered."""
    answered: list[float] = []

    def probe() -> float:
        answered.append(probes[len(answered)])
        return answered[-1]

    return RestorePolicy(
        RestoreCosts(10e-6, 60e-6, 0.0, SLOW), ALL_HIDDEN, 0, probe, max_age_seconds
    ), answered


def test_a_probe_at_plan_time_replans_on_a_compute_swing_up_and_down() -> None:
    unprobed = RestorePolicy(RestoreCosts(10e-6, 60e-6, 0.0, SLOW), ALL_HIDDEN).plan("slow", 1000)
    # compute 3x dearer, then 3x cheaper, than the costs learnt earlier
    policy, answered = probed_policy([30e-6, 10e-6 / 3])
    dearer, cheaper = policy.plan("slow", 1000), policy.plan("slow", 1000)
    assert answered == [30e-6, 10e-6 / 3]
    assert dearer.recompute_layers < unprobed.recompute_layers < cheaper.recompute_layers
    assert cheaper.recompute_layers == 4  # reading is slower than recomputing everything now
    for plan, probed in zip((dearer, cheaper), answered, strict=True):
        costs = policy.costs.compute_scaled(probed / policy.costs.project_seconds)
        assert plan.estimated_seconds == pytest.approx(
            restore_seconds(costs, "slow", 1000, plan.recompute_layers, plan.hidden_layers, 0)
        )
        for recompute in range(5):  # never slower than any plan the storage allows, as probed
            assert plan.estimated_seconds <= restore_seconds(costs, "slow", 1000, recompute, 4 - recompute, 0)
    assert policy.costs.project_seconds == 10e-6  # the probe rescales one plan, not the learnt costs


def test_no_probe_where_compute_cannot_change_the_plan_and_a_fresh_probe_is_reused() -> None:
    fast = {"fast": TierCosts(kv_seconds=2e-9, hidden_seconds=1e-9)}
    policy = RestorePolicy(
        RestoreCosts(10e-6, 60e-6, 0.0, fast), ALL_HIDDEN, 0, lambda: pytest.fail("probed")
    )
    assert policy.plan("fast", 1000).name == "r0h4k0"
    policy, answered = probed_policy([30e-6, 1e-6], max_age_seconds=60.0)
    assert policy.plan("slow", 1000) == policy.plan("slow", 1000)
    assert answered == [30e-6]
