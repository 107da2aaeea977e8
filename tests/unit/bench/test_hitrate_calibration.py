"""The calibration's learned hit density (bench/hitrate/learned_density.py) on a schedule
whose answer is known: chains come back 40 s after they were stored, the store turns over
in 10 s, so LRU hits nothing, and the optimum keeps as many chains as fit until they come
back (1/6 of the chunks looked up). Nothing online tells a returning chain from another,
so a policy can at best keep a quarter of all chains for 40 s: half the optimum. A density
learned by idle age keeps the older chains (their reuse is nearer) and gives up the new
ones: it must earn at least half of that, as it learns while it goes."""

from __future__ import annotations

from bench.hitrate.calibration import Step, hit_rate, optimal_rate

GAP_S = 40.0
CHAIN = 4
CAPACITY = 40  # chunks: 10 chains, while 4 chunks arrive every second


def _returning(sessions: int = 400) -> list[Step]:
    """One session a second, a chain of CHAIN new chunks; every other one comes back
    GAP_S later (the same chain looked up, one chunk more stored)."""
    steps, service_s = [], 0.001
    for session in range(sessions):
        chain = tuple(f"s{session}/{depth}".encode() for depth in range(CHAIN + 1))
        steps += [Step(session, session, chain[:CHAIN], True),
                  Step(session + service_s, session, chain[:CHAIN], False)]
        if session % 2 == 0:
            back = session + GAP_S
            steps += [Step(back, -1 - session, chain[:CHAIN], True),
                      Step(back + service_s, -1 - session, chain, False)]
    steps.sort(key=lambda step: (step.time_s, step.lookup))
    return steps


def test_the_learned_density_keeps_what_lru_loses() -> None:
    steps = _returning()
    optimal = optimal_rate(steps, CAPACITY)
    assert hit_rate(steps, CAPACITY, "lru") == 0
    assert optimal > 0.1
    assert hit_rate(steps, CAPACITY, "learned") > 0.25 * optimal
