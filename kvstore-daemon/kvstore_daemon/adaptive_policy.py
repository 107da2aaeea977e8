"""The lowest tier's order under the predictive policy: the predictive order or LRU,
whichever the shadow caches on a sample of the keys say hits more lately
(order_chooser.py).

The predictive order wins where its signals say something (Mooncake's think times, end
signals) and may lose where they do not: on ShareGPT without end signals think times are
memoryless and only recency tells an ended session from a live one, which LRU uses
directly (in process at 0.5% / 5%: predictive 45.44% vs LRU 45.89%). Neither can tell
which case holds beforehand, so the shadows play both on the sample. Keys hinted
EVICT_FIRST or DECLINE go first under both orders: they are certain. Only the lowest
tier adapts (its evictions are what the store loses); DRAM keeps the predictive order,
which is what puts predicted chunks there.
"""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedList

from kvstore_daemon.order_chooser import OrderChooser
from kvstore_daemon.predictive_policy import PredictivePolicy


class AdaptivePolicy:
    def __init__(self, predictive: PredictivePolicy, chooser: OrderChooser) -> None:
        """`predictive` is the lowest tier's predictive order (its lives shared with DRAM's);
        `chooser` watches the same lives."""
        self._predictive = predictive
        self._lives = predictive.lives
        self.chooser = chooser
        # Resident keys by their last use in the store (a chunk DRAM demoted keeps its place:
        # ordered by its arrival on SSD instead, LRU ranked DRAM's demotion order, not recency).
        self._used_at: dict[bytes, int] = {}  # key -> tick of its last write or read
        self._lru = SortedList()  # (tick, key), least recently used first

    def on_insert(self, key: bytes) -> None:
        self._predictive.on_insert(key)
        self._used(key)

    def on_access(self, key: bytes) -> None:
        self._predictive.on_access(key)
        if key in self._used_at:
            self._used(key)

    def _used(self, key: bytes) -> None:
        tick = self._used_at.get(key)
        if tick is not None:
            self._lru.remove((tick, key))
        tick = self._used_at[key] = self._lives.lives[key].tick
        self._lru.add((tick, key))

    def on_remove(self, key: bytes) -> None:
        self._predictive.on_remove(key)
        tick = self._used_at.pop(key, None)
        if tick is not None:
            self._lru.remove((tick, key))

    def __len__(self) -> int:
        return len(self._used_at)

    def __contains__(self, key: object) -> bool:
        return key in self._used_at

    def victims(self) -> Iterator[bytes]:
        if self.chooser.predictive:
            return self._predictive.victims()
        return self._lru_walk()

    def _lru_walk(self) -> Iterator[bytes]:
        yield from self._predictive.given_up(self._predictive.refresh())
        yield from (key for _, key in self._lru)  # the tier stops walking before it removes its victim
