"""The lowest tier's order under the predictive policy: the predictive order or LRU, chosen
online, eviction by eviction, by which of them has recently thrown out what was needed
again (LeCaR, Vietri et al., HotStorage'18: two experts, ARC's ghost lists as regrets).

The predictive order wins where its signals say something (Mooncake's think times, end
signals) and loses where they do not: on ShareGPT without end signals think times are
memoryless and only recency tells an ended session from a live one, which LRU uses
directly (predictive 67.5% vs LRU 70.1% at 1% / 10%). Neither can tell which case holds
beforehand, so both play:

- each eviction follows the predictive order with probability `weight`, else LRU (keys
  hinted EVICT_FIRST or DECLINE still go first under both: they are certain);
- a chunk that leaves the store is remembered in its expert's ghost list (as many as the
  tier holds, oldest forgotten first);
- a chunk stored again while in an expert's ghost list was a mistake of that expert: its
  weight shrinks by exp(-learning_rate * r), r = 0.005 ** (ticks since the eviction /
  chunks in the store), so a mistake found late counts less (LeCaR's discount).

The weight stays within [MIN_WEIGHT, 1 - MIN_WEIGHT], so the losing order still evicts
now and then and can show when the workload turns its way. The draw is seeded: a replay
evicts the same chunks every run. Only the lowest tier adapts (its evictions are what the
store loses); DRAM keeps the predictive order, which is what puts predicted chunks there.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Iterator

from sortedcontainers import SortedList

from kvstore_daemon import metrics
from kvstore_daemon.predictive_policy import PredictivePolicy

PREDICTIVE, LRU = 0, 1
ORDERS = ("predictive", "lru")
MIN_WEIGHT = 0.01
DISCOUNT_AT_STORE_SIZE = 0.005  # LeCaR's discount of a regret found one store's worth of ticks late


class AdaptivePolicy:
    def __init__(self, predictive: PredictivePolicy, learning_rate: float, seed: int = 0) -> None:
        """`predictive` is the lowest tier's predictive order (its lives shared with DRAM's)."""
        self._predictive = predictive
        self._lives = predictive.lives
        self._rate = learning_rate
        self._random = random.Random(seed)
        self.weight = 0.5  # of the predictive order
        # Resident keys by their last use in the store (a chunk DRAM demoted keeps its place:
        # ordered by its arrival on SSD instead, LRU ranked DRAM's demotion order, not recency).
        self._used_at: dict[bytes, int] = {}  # key -> tick of its last write or read
        self._lru = SortedList()  # (tick, key), least recently used first
        self._ghosts = (OrderedDict[bytes, int](), OrderedDict[bytes, int]())  # per order: key -> tick at eviction
        self._last: tuple[bytes, int] | None = None  # the key the latest walk yielded last, and its order
        self._lives.born.append(self._stored)
        metrics.PREDICTIVE_WEIGHT.set(self.weight)

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
        if tick is None:
            return
        self._lru.remove((tick, key))
        if self._last is not None and self._last[0] == key:  # the walk's victim
            order, self._last = self._last[1], None
            if key not in self._lives.lives:  # it left the store
                ghosts = self._ghosts[order]
                ghosts[key] = self._lives.tick
                while len(ghosts) > max(len(self._used_at), 1):
                    ghosts.popitem(last=False)

    def __len__(self) -> int:
        return len(self._used_at)

    def __contains__(self, key: object) -> bool:
        return key in self._used_at

    def victims(self) -> Iterator[bytes]:
        if self._random.random() < self.weight:
            return self._tagged(PREDICTIVE, self._predictive.victims())
        return self._tagged(LRU, self._lru_walk())

    def _lru_walk(self) -> Iterator[bytes]:
        yield from self._predictive.given_up(self._predictive.refresh())
        yield from (key for _, key in self._lru)  # the tier stops walking before it removes its victim

    def _tagged(self, order: int, keys: Iterator[bytes]) -> Iterator[bytes]:
        for key in keys:
            self._last = (key, order)
            yield key

    def _stored(self, key: bytes) -> None:
        """`key` entered the store: if an order evicted it lately, that order was wrong."""
        for order, ghosts in enumerate(self._ghosts):
            tick = ghosts.pop(key, None)
            if tick is not None:
                late = (self._lives.tick - tick) / max(len(self._lives.lives), 1)
                self._penalize(order, DISCOUNT_AT_STORE_SIZE**late)
                metrics.ORDER_REGRETS.labels(ORDERS[order]).inc()

    def _penalize(self, order: int, regret: float) -> None:
        weights = [self.weight, 1 - self.weight]
        weights[order] *= math.exp(-self._rate * regret)
        self.weight = min(max(weights[PREDICTIVE] / sum(weights), MIN_WEIGHT), 1 - MIN_WEIGHT)
        metrics.PREDICTIVE_WEIGHT.set(self.weight)
