"""How bench-restore orders and summarizes its repeated samples.

Orders: the rounds go through every permutation of the runs, so that over a full cycle
each run comes right after each other one equally often. The earlier rotation by one kept
the runs' cyclic order, so one run always followed the same other: the planner always came
right after hidden-only's compute-heavy restore (the sixth session's full run, where the
planner's plan was exactly KV loading and measured 1.055x its time on DRAM and 2.1x on disk).

Summary: the median sample, not the best: the best of a few samples rewards whichever
method met the machine's one quiet moment, and the median of a balanced set of orders
does not depend on which method ran after which. Ratios between methods are paired per
round (`paired_ratio`): on the shared 2-core machine (load 5) one method's samples of a
1k DRAM restore spread 6x (32-198 ms) with the spells of other jobs' load, and every
method of a round meets the same spell.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import TypeVar

Sample = TypeVar("Sample", bound=tuple)


def round_orders(runs: int, rounds: int) -> list[tuple[int, ...]]:
    """The order of the `runs` runs in each of `rounds` rounds: the permutations in turn
    (all of them, each ordered pair adjacent equally often, once `rounds` is a multiple of
    runs!)."""
    orders = list(itertools.permutations(range(runs)))
    return [orders[index % len(orders)] for index in range(rounds)]


def median_sample(samples: Sequence[Sample]) -> Sample:
    """The sample of median time (`sample[0]`, seconds; the lower middle one of an even
    count: a sample that was measured, with its own stats)."""
    ordered = sorted(samples, key=lambda sample: sample[0])
    return ordered[(len(ordered) - 1) // 2]


def spread(seconds: Sequence[float]) -> float:
    """Slowest over fastest sample of one method: 1.0 for a single sample."""
    return max(seconds) / min(seconds)


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """The median over rounds of one method's time over another's in the same round (sample i
    of each ran in round i, seconds apart): a spell of load that slows a round slows both,
    where the ratio of the two medians would set one round's spell against another's. A
    method timed once (recomputation) is set against every round."""
    if len(numerator) == 1:
        numerator = list(numerator) * len(denominator)
    if len(denominator) == 1:
        denominator = list(denominator) * len(numerator)
    return statistics.median(n / d for n, d in zip(numerator, denominator, strict=True))
