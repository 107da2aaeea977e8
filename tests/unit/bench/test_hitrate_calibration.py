"""The calibration's learned hit density (bench/hitrate/learned_density.py) on a schedule
whose answer is known: chains come back 40 s after they were stored, the store turns over
in 10 s, so LRU hits nothing, and the optimum keeps as many chains as fit until they come
back (1/6 of the chunks looked up). Nothing online tells a returning chain from another,
so a policy can at best keep a quarter of all chains for 40 s: half the optimum. A density
learned by idle age keeps the older chains (their reuse is nearer) and gives up the new
ones: it must earn at least half of that, as it learns while it goes."""

from __future__ import annotations

from bench.hitrate.calibration import POLICIES, Step, hit_rate, lookup_hits, optimal_rate

GAP_S = 40.0
CHAIN = 4
CAPACITY = 40  # chunks: 10 chains, while 4 chunks arrive every second


def _returning(sessions: int = 400) -> list[Step]:
    """One session a second, a chain of CHAIN new chunks; every other one comes back
    GAP_S later (the same chain looked up, one chunk more stored)."""
    steps, service_s = [], 0.001
    for session in range(sessions):
        chain = tuple(f"s{session}/{depth}".encode() for depth in range(CHAIN + 1))
        steps += [
            Step(session, session, chain[:CHAIN], True),
            Step(session + service_s, session, chain[:CHAIN], False),
        ]
        if session % 2 == 0:
            back = session + GAP_S
            steps += [
                Step(back, -1 - session, chain[:CHAIN], True),
                Step(back + service_s, -1 - session, chain, False),
            ]
    steps.sort(key=lambda step: (step.time_s, step.lookup))
    return steps


def test_the_learned_density_keeps_what_lru_loses() -> None:
    steps = _returning()
    optimal = optimal_rate(steps, CAPACITY)
    assert hit_rate(steps, CAPACITY, "lru") == 0
    assert optimal > 0.1
    assert hit_rate(steps, CAPACITY, "learned") > 0.25 * optimal


def test_no_online_policy_reads_the_future() -> None:
    """Each policy's hits up to a time are the same whether the schedule goes on or not."""
    steps = _returning()
    now = steps[len(steps) // 2].time_s
    past = [step for step in steps if step.time_s < now]
    for policy in POLICIES:
        whole = list(lookup_hits(steps, CAPACITY, policy))
        assert list(lookup_hits(past, CAPACITY, policy)) == whole[: sum(step.lookup for step in past)]
        assert sum(whole) > 0 or policy in ("lru", "lhd")  # those two hit nothing here (below)


def test_lhd_censored_by_its_own_evictions_learns_nothing_here() -> None:
    """LHD learns only from its own chunks' lives: evicted within 10 s, none lives to its
    read at 40 s, so no class ever shows a hit and it ranks by nothing better than LRU."""
    assert hit_rate(_returning(), CAPACITY, "lhd") == 0
