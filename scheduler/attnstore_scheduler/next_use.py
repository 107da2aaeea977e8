"""When will a session be used next? A small, pure, online estimator.

The queue sees seconds ahead; conversations come back after minutes (Mooncake's median
gap between two uses of a block is about 80 s, and only 13% of reuses come within 10 s).
So for every live session the scheduler predicts its next turn from what it knows now:

- the application's word first: a follow-up expected within N seconds, or the
  conversation is over (then never);
- past its TTL, or deleted: never;
- otherwise the session's own gaps between turns (shrunk towards the population's mean
  gap while it has few), how long it has been idle, and the chance that a session with
  its turn count comes back at all (learned online, `Population`). With exponential think
  times a session idle for `idle` seconds returns with probability
  p·S / (p·S + 1 − p), S = exp(−idle / gap); its predicted next use is
  gap / P(return): the expected wait, stretched for sessions that may never return, so
  the daemon's MIN order drops the likely-abandoned before the merely-slow.

Everything here is a function of the past: `now` and what was observed before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

NEVER = math.inf
MIN_RETURN_PROBABILITY = 1e-6  # below this a session counts as gone (its next use: NEVER)
TURN_BUCKETS = 8  # sessions with this many turns or more share one continuation estimate


@dataclass(frozen=True)
class SessionView:
    """What the scheduler knows of one session at `now` (all times on one clock)."""

    turns: int  # turns completed
    last_used_at: float  # when its last turn ended
    gaps_seconds: Sequence[float] = ()  # its own recent think times (turn end to next start)
    expires_at: float = NEVER  # its TTL's end
    expected_next_at: float | None = None  # the application's expectation, if any
    over: bool = False  # deleted, or the application said no further turn comes


@dataclass
class Population:
    """What all sessions taught so far: the mean gap and, per turn count, how often a
    session came back for another turn. Pseudo-counts keep the first estimates sane."""

    prior_gap_seconds: float = 60.0
    prior_continue: float = 0.5
    prior_weight: float = 4.0  # pseudo-observations behind each prior
    gap_sum_seconds: float = 0.0
    gaps: int = 0
    continued: list[int] = field(default_factory=lambda: [0] * TURN_BUCKETS)
    stopped: list[int] = field(default_factory=lambda: [0] * TURN_BUCKETS)

    def observe_gap(self, seconds: float) -> None:
        self.gap_sum_seconds += seconds
        self.gaps += 1

    def observe_continued(self, turns: int) -> None:
        """A session with `turns` turns came back for one more."""
        self.continued[_bucket(turns)] += 1

    def observe_stopped(self, turns: int, undo: bool = False) -> None:
        """A session with `turns` turns ended (deleted, expired, or idle so long it counts as
        gone); `undo` when one counted as gone came back after all."""
        self.stopped[_bucket(turns)] += -1 if undo else 1

    def mean_gap_seconds(self) -> float:
        return (self.gap_sum_seconds + self.prior_gap_seconds * self.prior_weight) / (self.gaps + self.prior_weight)

    def continue_probability(self, turns: int) -> float:
        b = _bucket(turns)
        seen = self.continued[b] + self.stopped[b]
        return (self.continued[b] + self.prior_continue * self.prior_weight) / (seen + self.prior_weight)


def _bucket(turns: int) -> int:
    return min(max(turns, 0), TURN_BUCKETS - 1)


def session_gap_seconds(view: SessionView, population: Population) -> float:
    """The session's expected think time: its own mean gap shrunk towards the population's."""
    weight = population.prior_weight
    return (sum(view.gaps_seconds) + population.mean_gap_seconds() * weight) / (len(view.gaps_seconds) + weight)


def return_probability(view: SessionView, now: float, population: Population) -> float:
    """P(the session takes another turn | it has been idle since its last one)."""
    if view.over or now >= view.expires_at:
        return 0.0
    p = population.continue_probability(view.turns)
    survival = math.exp(-max(0.0, now - view.last_used_at) / session_gap_seconds(view, population))
    return p * survival / (p * survival + 1 - p) if p < 1 else 1.0


def next_use_seconds(view: SessionView, now: float, population: Population) -> float:
    """Seconds from `now` to the session's predicted next use; NEVER when it is not
    expected back (over, expired, or predicted beyond its TTL)."""
    if view.over or now >= view.expires_at:
        return NEVER
    if view.expected_next_at is not None:
        return max(0.0, view.expected_next_at - now)
    p = return_probability(view, now, population)
    if p < MIN_RETURN_PROBABILITY:
        return NEVER
    seconds = session_gap_seconds(view, population) / p
    return seconds if now + seconds < view.expires_at else NEVER


def is_gone(view: SessionView, now: float, population: Population, idle_gaps: float) -> bool:
    """Idle for more than `idle_gaps` of its expected gaps: count it as stopped (online
    learning of the continuation odds needs an end even when no one says so)."""
    return now - view.last_used_at > idle_gaps * session_gap_seconds(view, population)
