"""The warm-up replay's windows (bench/hitrate/warmup.py) add up to the whole replay."""

from __future__ import annotations

from bench.hitrate.calibration import Step, hit_rate, lookup_hits, optimal_rate
from bench.hitrate.warmup import _window_rates, optimal_window_rates

CAPACITY = 6  # chunks: two chains of three


def _schedule() -> list[Step]:
    """A chain a second, each of four chains again 5 s later: MIN keeps some, LRU none."""
    steps = []
    for job in range(40):
        chain = tuple(f"c{job % 4 + 4 * (job // 8)}/{depth}".encode() for depth in range(3))
        steps += [Step(float(job), job, chain, True), Step(job + 0.5, job, chain, False)]
    return steps


def test_one_window_is_the_whole_replay() -> None:
    steps = _schedule()
    assert optimal_window_rates(steps, CAPACITY, 1000.0) == [optimal_rate(steps, CAPACITY)]
    # the last store ends after the window of the last lookup: no window without lookups
    assert optimal_window_rates(steps, CAPACITY, 39.2) == [optimal_rate(steps, CAPACITY)]
    assert _window_rates(steps, list(lookup_hits(steps, CAPACITY, "lru")), 1000.0) == [
        hit_rate(steps, CAPACITY, "lru")
    ]


def test_the_windows_weigh_up_to_the_whole() -> None:
    steps = _schedule()
    looked = [
        sum(len(s.keys) for s in steps if s.lookup and w * 10 <= s.time_s < (w + 1) * 10) for w in range(4)
    ]
    optimal = optimal_window_rates(steps, CAPACITY, 10.0)
    assert len(optimal) == 4 and optimal_rate(steps, CAPACITY) > 0
    total = sum(rate * n for rate, n in zip(optimal, looked, strict=True)) / sum(looked)
    assert abs(total - optimal_rate(steps, CAPACITY)) < 1e-9
    learned = _window_rates(steps, list(lookup_hits(steps, CAPACITY, "learned")), 10.0)
    assert (
        abs(
            sum(r * n for r, n in zip(learned, looked, strict=True)) / sum(looked)
            - hit_rate(steps, CAPACITY, "learned")
        )
        < 1e-9
    )
