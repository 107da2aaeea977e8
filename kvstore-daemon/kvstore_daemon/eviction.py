"""Eviction policies: the order in which a tier gives up its resident chunks.

One instance per tier. The tier reports inserts, reads and removals; when it needs
room it walks `victims()` and skips what it may not evict (pinned, leased, still being
written). `victims()` is lazy, over the live order, so finding a victim costs what the
walk skips rather than a copy of every resident key: the tier takes its victim, stops
walking, evicts it (reporting the removal) and asks again.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Literal, Protocol

from kvstore_daemon.adaptive_policy import AdaptivePolicy
from kvstore_daemon.chunk_lives import GHOST_KEYS_MAX, NAMED_KEYS_MAX, ChunkLives
from kvstore_daemon.hints import HintAction, HintBook
from kvstore_daemon.order_chooser import SWITCH_Z, OrderChooser
from kvstore_daemon.predictive_policy import PredictivePolicy

PolicyName = Literal["lru", "fifo", "lookahead", "predictive"]


class EvictionPolicy(Protocol):
    def on_insert(self, key: bytes) -> None:
        """The key became resident (re-inserting a resident key counts as new)."""

    def on_access(self, key: bytes) -> None:
        """The key was read; ignored for keys that are not resident."""

    def on_remove(self, key: bytes) -> None:
        """The key left the tier; ignored for keys that are not resident."""

    def victims(self) -> Iterator[bytes]:
        """Resident keys, the one to evict first first; valid until the policy changes."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...


class _KeyOrder:
    """Resident keys in eviction order (front = evict first), shared by the policies."""

    def __init__(self) -> None:
        self._order: OrderedDict[bytes, None] = OrderedDict()

    def on_insert(self, key: bytes) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def on_remove(self, key: bytes) -> None:
        self._order.pop(key, None)

    def victims(self) -> Iterator[bytes]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order


class FifoPolicy(_KeyOrder):
    """Evicts in insertion order; reads change nothing."""

    def on_access(self, key: bytes) -> None:
        pass


class LruPolicy(_KeyOrder):
    """Evicts the least recently inserted or read key first."""

    def on_access(self, key: bytes) -> None:
        if key in self._order:
            self._order.move_to_end(key)


class LookaheadPolicy:
    """AttentionStore's scheduler-aware order, from the live hints at call time:

    1. keys hinted EVICT_FIRST (LRU among themselves);
    2. keys no live hint mentions (LRU among themselves; an expired hint counts as none);
    3. PROTECT/PREFETCH keys by queue position, furthest first: what the queue needs
       last goes first, and a PREFETCH for the next job goes very last.

    Hinted keys are never the LRU victim, so they pile up at the front of the LRU order
    (a queued session's chunks were last read a turn ago). To keep finding a victim cheap,
    the hinted keys at the front are parked beside the order, and put back in their LRU
    place (by last-use tick) once their hint is gone: replaced, forgotten or expired.
    """

    def __init__(self, hints: HintBook, clock: Callable[[], float] = time.monotonic) -> None:
        self._hints = hints
        self._clock = clock
        self._ticks = itertools.count()
        self._order: OrderedDict[bytes, int] = OrderedDict()  # key -> last-use tick, ascending
        self._parked: dict[bytes, int] = {}  # hinted keys taken off the front of _order
        self._generation = hints.generation

    def on_insert(self, key: bytes) -> None:
        self._parked.pop(key, None)
        self._order[key] = next(self._ticks)
        self._order.move_to_end(key)

    def on_access(self, key: bytes) -> None:
        if key in self._order or self._parked.pop(key, None) is not None:
            self._order[key] = next(self._ticks)
            self._order.move_to_end(key)

    def on_remove(self, key: bytes) -> None:
        if self._order.pop(key, None) is None:
            self._parked.pop(key, None)

    def __len__(self) -> int:
        return len(self._order) + len(self._parked)

    def __contains__(self, key: object) -> bool:
        return key in self._order or key in self._parked

    def victims(self) -> Iterator[bytes]:
        now = self._clock()
        self._hints.expire(now)  # cheap unless a hint is due; changes the generation if any went
        if self._hints.generation != self._generation:
            self._generation = self._hints.generation
            self._unpark([key for key in self._parked if self._hints.get(key, now) is None])
        return self._walk(now)

    def _walk(self, now: float) -> Iterator[bytes]:
        first = [key for key in self._hints.evict_first_keys(now) if key in self]
        yield from sorted(first, key=self._tick)
        while self._order:  # park the hinted front: the walk below starts at an unhinted key
            key, tick = next(iter(self._order.items()))
            if self._hints.get(key, now) is None:
                break
            del self._order[key]
            self._parked[key] = tick
        needed: list[tuple[int, bool, int, bytes]] = []  # (-queue_position, is PREFETCH, tick, key)
        for key, tick in self._order.items():  # least recently used first
            hint = self._hints.get(key, now)
            if hint is None:
                yield key
            elif not hint.action.gives_up:
                needed.append((-hint.queue_position, hint.action is HintAction.PREFETCH, tick, key))
        for key, tick in self._parked.items():
            hint = self._hints.get(key, now)
            if hint is not None and not hint.action.gives_up:
                needed.append((-hint.queue_position, hint.action is HintAction.PREFETCH, tick, key))
        needed.sort()
        yield from (key for *_, key in needed)

    def _tick(self, key: bytes) -> int:
        return self._order[key] if key in self._order else self._parked[key]

    def _unpark(self, keys: list[bytes]) -> None:
        """Puts parked keys back into the order at their tick: merged with the keys in front
        of the newest of them (_order stays sorted by tick)."""
        if not keys:
            return
        back = sorted((self._parked.pop(key), key) for key in keys)
        front: list[tuple[int, bytes]] = []
        while self._order and next(iter(self._order.values())) < back[-1][0]:
            key, tick = self._order.popitem(last=False)
            front.append((tick, key))
        for tick, key in sorted(back + front, reverse=True):
            self._order[key] = tick
            self._order.move_to_end(key, last=False)


def make_tier_policies(
    name: PolicyName,
    hints: HintBook,
    clock: Callable[[], float] = time.monotonic,
    shadow_share: float = 0.0,
    ghost_keys_max: int = GHOST_KEYS_MAX,
    named_keys_max: int = NAMED_KEYS_MAX,
    switch_z: float = SWITCH_Z,
) -> tuple[EvictionPolicy, EvictionPolicy]:
    """DRAM's and SSD's instances of the named policy; predictive's share what they learn
    (a chunk moving between the tiers keeps its age and its reads), and with a positive
    `shadow_share` the SSD's follows the predictive order or LRU, whichever the shadow
    caches on that share of the keys say hits more (adaptive_policy.py)."""
    if name == "predictive":
        lives = ChunkLives(clock, ghost_keys_max=ghost_keys_max, named_keys_max=named_keys_max)
        ssd = PredictivePolicy(hints, clock, lives)
        dram = PredictivePolicy(hints, clock, lives, lowest_tier=False)
        if shadow_share <= 0:
            return dram, ssd
        chooser = OrderChooser(lives, shadow_share, (PredictivePolicy(hints, clock), LruPolicy()), switch_z)
        return dram, AdaptivePolicy(ssd, chooser)
    return make_policy(name, hints, clock), make_policy(name, hints, clock)


def make_policy(
    name: PolicyName, hints: HintBook, clock: Callable[[], float] = time.monotonic
) -> EvictionPolicy:
    """The policy named in the settings, for one tier alone; `hints` and `clock` matter to
    lookahead and predictive."""
    if name == "lru":
        return LruPolicy()
    if name == "fifo":
        return FifoPolicy()
    if name == "lookahead":
        return LookaheadPolicy(hints, clock)
    if name == "predictive":
        return PredictivePolicy(hints, clock)
    raise ValueError(f"unknown eviction policy {name!r}")
