"""The predictive eviction order: Belady's MIN on the scheduler's predictions.

The offline optimum for chained chunk keys evicts the chunk used furthest in the future,
the deepest among equals (bench/hitrate/optimal.py). Online, the scheduler predicts every
live session's and shared prefix's next use and hints it (PREDICT with seconds from
now; PREFETCH/PROTECT for queued jobs, which come first), so the order is:

1. keys hinted EVICT_FIRST or DECLINE (least recently used first);
2. stale unhinted keys: no hint names them though predictions arrived since they were
   last touched, so no live session the scheduler knows of needs them (LRU among them);
3. predicted keys by next use, furthest first, the deepest among equals;
4. keys hinted since the last predictions arrived, and fresh unhinted keys (written or
   read since then: the scheduler has not had a chance to predict them), LRU among them;
5. queued jobs' keys by queue position, furthest first (`Hint.rank`).

The order is sorted when predictions arrive (the scheduler sends them every few
seconds), not per victim and not per queue push (several a second): between two, each
key's live hint is checked as the walk reaches it, so a key a queued job now needs moves
to the end, and one given up moves to the front at the next sort.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from kvstore_daemon.hints import Hint, HintAction, HintBook


class PredictivePolicy:
    def __init__(self, hints: HintBook, clock: Callable[[], float] = time.monotonic) -> None:
        self._hints = hints
        self._clock = clock
        self._order: OrderedDict[bytes, float] = OrderedDict()  # resident key -> last touch, LRU first
        # Sorted when predictions arrive, so finding a victim does not walk every key:
        self._sorted_for = (-1, -1)  # (prediction generation, resident keys) at the last sort
        self._unhinted: OrderedDict[bytes, float] = OrderedDict()  # resident, unhinted at the sort or since; LRU
        self._given_up: list[bytes] = []  # resident EVICT_FIRST/DECLINE keys at the sort, LRU first
        self._ranked: list[bytes] = []  # resident predicted keys at the sort, furthest use first
        self._sorted: set[bytes] = set()  # the keys of _given_up and _ranked
        self._starts = [0, 0]  # _given_up[:_starts[0]] and _ranked[:_starts[1]] are no longer resident
        self._late: OrderedDict[bytes, None] = OrderedDict()  # hinted keys resident since the sort

    def on_insert(self, key: bytes) -> None:
        now = self._clock()
        self._order[key] = now
        self._order.move_to_end(key)
        if self._hints.get(key, now) is None:
            self._unhinted[key] = now
            self._unhinted.move_to_end(key)
        elif key not in self._sorted:
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
        if self._hints.prediction_generation != self._sorted_for[0]:
            self._sort(now)
        return self._walk(now)

    def _sort(self, now: float) -> None:
        ranked: list[tuple[tuple[bool, float, int, bool], bytes]] = []
        self._unhinted.clear()
        self._given_up = []
        for key, touched in self._order.items():
            hint = self._hints.get(key, now)
            if hint is None:
                self._unhinted[key] = touched
            elif hint.action.gives_up:
                self._given_up.append(key)
            elif hint.action is HintAction.PREDICT:
                ranked.append((hint.rank(), key))
        ranked.sort(key=lambda item: item[0], reverse=True)  # stable: equal ranks stay in LRU order
        self._ranked = [key for _, key in ranked]
        self._sorted = set(self._given_up) | set(self._ranked)
        self._starts = [0, 0]
        self._late = OrderedDict((key, None) for key in self._order if key not in self._sorted
                                 and key not in self._unhinted)  # queued keys: their live hint orders them
        self._sorted_for = (self._hints.prediction_generation, len(self._order))

    def _walk(self, now: float) -> Iterator[bytes]:
        queued: list[tuple[tuple[bool, float, int, bool], bytes]] = []

        def live(key: bytes, wanted: Callable[[Hint | None], bool]) -> bool:
            """Whether the key's live hint still puts it here; a queued one is set aside."""
            hint = self._hints.get(key, now)
            if hint is not None and hint.action in (HintAction.PREFETCH, HintAction.PROTECT):
                queued.append((hint.rank(), key))
                return False
            return wanted(hint)

        yield from (key for key in self._resident(0, self._given_up) if live(key, lambda h: h is not None))
        fresh_since = self._hints.last_prediction_at
        for key, touched in list(self._unhinted.items()):  # stale first: ordered by touch
            if touched >= fresh_since:
                break
            if live(key, lambda h: h is None):
                yield key
        yield from (key for key in self._resident(1, self._ranked) if live(key, lambda h: h is not None))
        yield from (key for key in list(self._late) if live(key, lambda h: True))
        yield from (key for key, touched in list(self._unhinted.items())
                    if touched >= fresh_since and live(key, lambda h: h is None))
        queued.sort(key=lambda item: item[0], reverse=True)
        yield from (key for _, key in queued)

    def _resident(self, which: int, keys: list[bytes]) -> Iterator[bytes]:
        """The still-resident `keys`, in order; the gone ones at the front are skipped for good."""
        start = self._starts[which]
        while start < len(keys) and keys[start] not in self._order:
            start += 1  # evicted from the front since the sort
        self._starts[which] = start
        return (key for key in keys[start:] if key in self._order)
