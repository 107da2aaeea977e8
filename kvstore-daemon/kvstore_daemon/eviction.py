"""Eviction policies: the order in which a tier gives up its resident chunks.

One instance per tier. The tier reports inserts, reads and removals; when it needs
room it walks `victims()` and skips what it may not evict (pinned, leased, still being
written). `victims()` returns a snapshot, so the tier may evict, and report the
removal, while it walks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Literal, Protocol

from kvstore_daemon.hints import HintAction, HintBook

PolicyName = Literal["lru", "fifo", "lookahead"]


class EvictionPolicy(Protocol):
    def on_insert(self, key: bytes) -> None:
        """The key became resident (re-inserting a resident key counts as new)."""

    def on_access(self, key: bytes) -> None:
        """The key was read; ignored for keys that are not resident."""

    def on_remove(self, key: bytes) -> None:
        """The key left the tier; ignored for keys that are not resident."""

    def victims(self) -> Iterator[bytes]:
        """Resident keys, the one to evict first first; a snapshot."""
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
        return iter(list(self._order))

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


class LookaheadPolicy(LruPolicy):
    """AttentionStore's scheduler-aware order, from the live hints at call time:

    1. keys hinted EVICT_FIRST (LRU among themselves);
    2. keys no live hint mentions (LRU among themselves; an expired hint counts as none);
    3. PROTECT/PREFETCH keys by queue position, furthest first: what the queue needs
       last goes first, and a PREFETCH for the next job goes very last.
    """

    def __init__(self, hints: HintBook, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._hints = hints
        self._clock = clock

    def victims(self) -> Iterator[bytes]:
        now = self._clock()
        evict_first: list[bytes] = []
        unhinted: list[bytes] = []
        needed: list[tuple[int, bool, bytes]] = []  # (-queue_position, is PREFETCH, key)
        for key in self._order:  # least recently used first
            hint = self._hints.get(key, now)
            if hint is None:
                unhinted.append(key)
            elif hint.action is HintAction.EVICT_FIRST:
                evict_first.append(key)
            else:
                needed.append((-hint.queue_position, hint.action is HintAction.PREFETCH, key))
        needed.sort(key=lambda item: item[:2])  # stable: LRU order breaks ties
        return iter(evict_first + unhinted + [key for _, _, key in needed])


def make_policy(
    name: PolicyName, hints: HintBook, clock: Callable[[], float] = time.monotonic
) -> EvictionPolicy:
    """The policy named in the settings; `hints` and `clock` matter only to lookahead."""
    if name == "lru":
        return LruPolicy()
    if name == "fifo":
        return FifoPolicy()
    if name == "lookahead":
        return LookaheadPolicy(hints, clock)
    raise ValueError(f"unknown eviction policy {name!r}")
