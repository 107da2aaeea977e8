"""When will a session be used next? A small, pure, online estimator.

The queue sees seconds ahead; conversations come back after minutes (Mooncake's median
gap between two uses of a block is about 80 s, and only 13% of reuses come within 10 s).
So for every live session the scheduler predicts its next turn from what it knows now:

- the application's word first: a follow-up expected within N seconds, or the
  conversation is over (then never);
- past its TTL, or deleted: never;
- otherwise from how long think times are (the population's distribution of gaps between
  turns, learned online as a histogram, scaled to the session's own gaps), how long the
  session has been idle (`idle`), and how often sessions with its turn count came back at
  all (`p`, learned online). It returns with probability P = p·S / (p·S + 1 − p), S =
  P(gap > idle); if it does, after E[gap − idle | gap > idle] more seconds; its predicted
  next use is that wait / P: the likely-abandoned go before the merely slow, and a
  session in the middle of a typical think time is kept over a brand-new one (think
  times have a mode: Mooncake's median gap is ~70 s, few come within 10 s), which is what
  lets MIN hold a stable set long enough to be reused where LRU cycles everything.

Everything here is a function of the past: `now` and what was observed before it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

NEVER = math.inf
MIN_RETURN_PROBABILITY = 1e-6  # below this a session counts as gone (its next use: NEVER)
TURN_BUCKETS = 8  # sessions with this many turns or more share one continuation estimate
# The continuation odds are learned late (a session counts as stopped only once idle for
# long), so early on they read near 1, where idle time would stop mattering at all: with
# them capped, a session idle far beyond the usual gap is still let go (on ShareGPT
# replays the uncapped estimate fell 3 points of hit rate below LRU).
MAX_CONTINUE_PROBABILITY = 0.9


@dataclass(frozen=True)
class SessionView:
    """What the scheduler knows of one session at `now` (all times on one clock)."""

    turns: int  # turns completed
    last_used_at: float  # when its last turn ended
    gaps_seconds: Sequence[float] = ()  # its own recent think times (turn end to next start)
    expires_at: float = NEVER  # its TTL's end
    expected_next_at: float | None = None  # the application's expectation, if any
    over: bool = False  # deleted, or the application said no further turn comes


# Gap histogram bins: 0.5 s to ~4.6 h, 25% wider each.
_EDGES = tuple(0.5 * 1.25**i for i in range(42))
_MIDS = tuple((low + high) / 2 for low, high in zip((0.0, *_EDGES[:-1]), _EDGES, strict=True))


def _exponential_masses(mean_seconds: float) -> list[float]:
    """An exponential's probability per bin (the last bin takes the tail)."""
    cdf = [1 - math.exp(-edge / mean_seconds) for edge in _EDGES]
    masses = [high - low for low, high in zip((0.0, *cdf[:-1]), cdf, strict=True)]
    masses[-1] += 1 - cdf[-1]
    return masses


@dataclass
class Population:
    """What all sessions taught so far: the distribution of gaps between turns and, per
    turn count, how often a session came back for another turn. Pseudo-counts (an
    exponential gap of `prior_gap_seconds`, a `prior_continue` chance) keep the first
    estimates sane."""

    prior_gap_seconds: float = 60.0
    prior_continue: float = 0.5
    prior_weight: float = 4.0  # pseudo-observations behind each prior
    gap_sum_seconds: float = 0.0
    gaps: int = 0
    continued: list[int] = field(default_factory=lambda: [0] * TURN_BUCKETS)
    stopped: list[int] = field(default_factory=lambda: [0] * TURN_BUCKETS)
    histogram: list[float] = field(default_factory=list)  # gap mass per bin, prior included

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [m * self.prior_weight for m in _exponential_masses(self.prior_gap_seconds)]

    def observe_gap(self, seconds: float) -> None:
        self.gap_sum_seconds += seconds
        self.gaps += 1
        self.histogram[min(bisect.bisect_left(_EDGES, seconds), len(_EDGES) - 1)] += 1

    def survival_and_wait(self, idle_seconds: float) -> tuple[float, float]:
        """(P(gap > idle), E[gap - idle | gap > idle]) from the histogram (bin midpoints)."""
        total = sum(self.histogram)
        beyond = mass = 0.0
        for middle, count in zip(_MIDS, self.histogram, strict=True):
            if middle > idle_seconds:
                mass += count
                beyond += count * (middle - idle_seconds)
        if mass == 0:
            return 0.0, self.mean_gap_seconds()
        return mass / total, beyond / mass

    def observe_continued(self, turns: int) -> None:
        """A session with `turns` turns came back for one more."""
        self.continued[_bucket(turns)] += 1

    def observe_stopped(self, turns: int, undo: bool = False) -> None:
        """A session with `turns` turns ended (deleted, expired, or idle so long it counts as
        gone); `undo` when one counted as gone came back after all."""
        self.stopped[_bucket(turns)] += -1 if undo else 1

    def mean_gap_seconds(self) -> float:
        return (self.gap_sum_seconds + self.prior_gap_seconds * self.prior_weight) / (
            self.gaps + self.prior_weight
        )

    def continue_probability(self, turns: int) -> float:
        b = _bucket(turns)
        seen = self.continued[b] + self.stopped[b]
        learned = (self.continued[b] + self.prior_continue * self.prior_weight) / (seen + self.prior_weight)
        return min(learned, MAX_CONTINUE_PROBABILITY)


def _bucket(turns: int) -> int:
    return min(max(turns, 0), TURN_BUCKETS - 1)


def session_gap_seconds(view: SessionView, population: Population) -> float:
    """The session's expected think time: its own mean gap shrunk towards the population's."""
    weight = population.prior_weight
    return (sum(view.gaps_seconds) + population.mean_gap_seconds() * weight) / (
        len(view.gaps_seconds) + weight
    )


def _return_and_wait(view: SessionView, now: float, population: Population) -> tuple[float, float]:
    """(P(another turn | idle so far), E[seconds to it | it comes]); the population's gap
    distribution is stretched by the session's own gaps relative to the population's."""
    if view.over or now >= view.expires_at:
        return 0.0, NEVER
    scale = session_gap_seconds(view, population) / population.mean_gap_seconds()
    survival, wait = population.survival_and_wait(max(0.0, now - view.last_used_at) / scale)
    p = population.continue_probability(view.turns)
    chance = p * survival / (p * survival + 1 - p) if p < 1 else 1.0
    return chance, wait * scale


def return_probability(view: SessionView, now: float, population: Population) -> float:
    """P(the session takes another turn | it has been idle since its last one)."""
    return _return_and_wait(view, now, population)[0]


def next_use_seconds(view: SessionView, now: float, population: Population) -> float:
    """Seconds from `now` to the session's predicted next use; NEVER when it is not
    expected back (over, expired, or predicted beyond its TTL)."""
    if view.over or now >= view.expires_at:
        return NEVER
    if view.expected_next_at is not None:
        return max(0.0, view.expected_next_at - now)
    chance, wait = _return_and_wait(view, now, population)
    if chance < MIN_RETURN_PROBABILITY:
        return NEVER
    seconds = wait / chance
    return seconds if now + seconds < view.expires_at else NEVER


def is_gone(view: SessionView, now: float, population: Population, idle_gaps: float) -> bool:
    """Idle for more than `idle_gaps` of its expected gaps: count it as stopped (online
    learning of the continuation odds needs an end even when no one says so)."""
    return now - view.last_used_at > idle_gaps * session_gap_seconds(view, population)
