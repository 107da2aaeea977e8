"""The predictive eviction order: Belady's MIN on the scheduler's predictions.

The offline optimum for chained chunk keys evicts the chunk used furthest in the future,
the deepest among equals (bench/hitrate/optimal.py). Online, the scheduler predicts every
live session's and shared prefix's next use and hints it (PREDICT with seconds from
now; PREFETCH/PROTECT for queued jobs, which come first), so the order, from the live
hints at call time, is:

1. keys hinted EVICT_FIRST or DECLINE (least recently used first);
2. stale unhinted keys: no hint names them though predictions arrived since they were
   last touched, so no live session the scheduler knows of needs them (LRU among them);
3. predicted keys by next use, furthest first, the deepest among equals; then queued
   jobs' keys by queue position, furthest first (`Hint.rank`);
4. fresh unhinted keys (written or read since the last predictions arrived: the
   scheduler has not had a chance to predict them), LRU among them.

The hinted order is sorted once per change of the hints (its generation), not per victim.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from kvstore_daemon.hints import HintBook


class PredictivePolicy:
    def __init__(self, hints: HintBook, clock: Callable[[], float] = time.monotonic) -> None:
        self._hints = hints
        self._clock = clock
        self._order: OrderedDict[bytes, float] = OrderedDict()  # resident key -> last touch, LRU first
        # Kept per generation of the hints, so finding a victim does not walk every key:
        self._generation = -1
        self._unhinted: OrderedDict[bytes, float] = OrderedDict()  # resident, no live hint; LRU first
        self._given_up: list[bytes] = []  # resident EVICT_FIRST/DECLINE keys at the last rebuild, LRU first
        self._ranked: list[bytes] = []  # resident kept keys at the last rebuild, furthest use first
        self._ranked_set: set[bytes] = set()
        self._starts = [0, 0]  # _given_up[:_starts[0]] and _ranked[:_starts[1]] are no longer resident
        self._late: OrderedDict[bytes, None] = OrderedDict()  # hinted keys that arrived since the rebuild

    def on_insert(self, key: bytes) -> None:
        now = self._clock()
        self._order[key] = now
        self._order.move_to_end(key)
        if self._hints.get(key, now) is None:
            self._unhinted[key] = now
            self._unhinted.move_to_end(key)
        elif key not in self._ranked_set:
            self._late[key] = None

    def on_access(self, key: bytes) -> None:
        if key in self._order:
            self.on_insert(key)

    def on_remove(self, key: bytes) -> None:
        if self._order.pop(key, None) is not None:
            self._unhinted.pop(key, None)
            self._late.pop(key, None)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def victims(self) -> Iterator[bytes]:
        now = self._clock()
        self._hints.expire(now)
        if self._hints.generation != self._generation:
            self._rebuild(now)
        return self._walk(now)

    def _rebuild(self, now: float) -> None:
        self._generation = self._hints.generation
        ranked: list[tuple[tuple[bool, float, int, bool], bytes]] = []
        self._unhinted.clear()
        self._given_up = []
        for key, touched in self._order.items():
            hint = self._hints.get(key, now)
            if hint is None:
                self._unhinted[key] = touched
            elif hint.action.gives_up:
                self._given_up.append(key)
            else:
                ranked.append((hint.rank(), key))
        ranked.sort(key=lambda item: item[0], reverse=True)  # stable: equal ranks stay in LRU order
        self._ranked = [key for _, key in ranked]
        self._ranked_set = set(self._ranked)
        self._starts = [0, 0]
        self._late.clear()

    def _walk(self, now: float) -> Iterator[bytes]:
        yield from self._resident(0, self._given_up)
        fresh_since = self._hints.last_prediction_at
        for key, touched in self._unhinted.items():  # stale first: ordered by touch
            if touched >= fresh_since:
                break
            yield key
        yield from self._resident(1, self._ranked)
        yield from list(self._late)
        yield from (key for key, touched in list(self._unhinted.items()) if touched >= fresh_since)

    def _resident(self, which: int, keys: list[bytes]) -> Iterator[bytes]:
        """The still-resident `keys`, in order; the gone ones at the front are skipped for good."""
        start = self._starts[which]
        while start < len(keys) and keys[start] not in self._order:
            start += 1  # evicted from the front since the rebuild
        self._starts[which] = start
        return (key for key in keys[start:] if key in self._order)
