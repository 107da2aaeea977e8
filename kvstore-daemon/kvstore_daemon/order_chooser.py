"""Which order the lowest tier follows, the predictive order or LRU, chosen online by
shadow caches on a sample of the keys (SHARDS, Waldspurger et al., FAST'15).

A key is sampled when its hash falls below `sample_share` of the hash range, so the
sample is the same whatever the order of requests. Each sampled request (a read of a
stored chunk, or a chunk entering the store: a write after a miss) goes to two shadow
caches that hold no data, one per order, each as large as `sample_share` of the chunks
the store holds: a shadow that holds the key counts a hit, one that does not takes it in
and evicts by its own order. The shadows see one tier (DRAM and SSD together), the same
for both, so what they compare is the orders, not the tiers' structure. The requests
depend on what the store holds (a chain the store cut is not asked for again), so the
shadows favour the order being followed: a switch must be clear. Fed every key lookups
ask for instead, a chooser in process on Mooncake's trace switched to LRU on a 2.6% lead
and lost 1.07 of 6.71 points in that spell (docs/benchmarks.md).

Hit scores decay by half every `HALF_LIFE_TURNOVERS` times the shadows' size in sampled
requests (a sliding window of about as many store turnovers). The tier follows the
other order once its lead is more than `switch_z` standard errors of the requests only
one shadow hit (a sign test, McNemar's: the requests both hit or both missed say nothing
of which order is better), after a warm-up of one window. A fixed margin of 2% of the
score switched on noise: on Mooncake's cold 1% / 10% cell, where the predictive shadow
hits about 37% more over the run, 2 of 6 runs on the real daemon spent 444 and 1,366
sampled requests on LRU, and the longer spell's run closed 18.0% of the LRU-to-optimum
gap against 22.9-24.4% for the runs without one (docs/benchmarks.md). A switch costs more
than the lead says (the other order inherits a store it did not build, and the shadows
favour the order followed), so only a lead noise does not explain may make one. Nothing
here reads the future: a shadow learns what a request hits only when it comes.

Why shadows, not regrets: LeCaR's regrets (a chunk stored again soon after an order
evicted it) drove the weight to LRU on Mooncake's conversation trace, where the
predictive order alone closes 3-5x more of the gap to the optimum (docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING

from kvstore_daemon import metrics
from kvstore_daemon.chunk_lives import ChunkLives

if TYPE_CHECKING:  # eviction.py builds the chooser
    from kvstore_daemon.eviction import EvictionPolicy

ORDERS = ("predictive", "lru")
HALF_LIFE_TURNOVERS = 2  # score half-life, in shadow sizes of sampled requests
# The other order takes over when its lead in the decayed requests only one shadow hit is
# over this many standard errors, sqrt(their sum) (with decayed counts the true one is
# about 0.7 of that, so 2 is about 2.8 true ones): the test is repeated at every sampled
# request, so it must be strict for noise not to cross it somewhere in a run.
SWITCH_Z = 2.0
MIN_SHADOW_KEYS = 8


class OrderChooser:
    def __init__(
        self,
        lives: ChunkLives,
        sample_share: float,
        shadows: tuple[EvictionPolicy, EvictionPolicy],
        switch_z: float = SWITCH_Z,
    ) -> None:
        """`lives` is the store's (its births and reads are the requests); `shadows` are empty
        instances of the orders (ORDERS), the predictive one with lives of its own (it learns
        from the sample)."""
        if not 0 < sample_share <= 1:
            raise ValueError("sample_share must be in (0, 1]")
        if switch_z < 0:
            raise ValueError("switch_z must not be negative")
        self._switch_z = switch_z
        self._lives = lives
        self._share = sample_share
        self._below = int(sample_share * (1 << 64))
        self._shadows = shadows
        self.scores = [0.0, 0.0]  # decayed shadow hits per order (ORDERS)
        self.alone = [0.0, 0.0]  # of them, decayed requests that order's shadow alone hit
        self.requests = 0  # sampled requests seen
        self.follows = 0  # index into ORDERS
        lives.born.append(self._requested)
        lives.reread.append(self._requested)
        metrics.ORDER_FOLLOWED.set(1)
        for order in ORDERS:  # exported from the start, zeros included
            metrics.SHADOW_HITS.labels(order)
            metrics.ORDER_SWITCHES.labels(order)
            metrics.ORDER_REQUESTS.labels(order)

    @property
    def predictive(self) -> bool:
        return self.follows == 0

    def _sampled(self, key: bytes) -> bool:
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") < self._below

    def _requested(self, key: bytes) -> None:
        if not self._sampled(key):
            return
        size = max(MIN_SHADOW_KEYS, round(self._share * len(self._lives.lives)))
        decay = 0.5 ** (1 / (HALF_LIFE_TURNOVERS * size))
        hits = [self._request(shadow, key, size) for shadow in self._shadows]
        for order, hit in enumerate(hits):
            self.scores[order] = self.scores[order] * decay + hit
            self.alone[order] = self.alone[order] * decay + (hit and not hits[1 - order])
            if hit:
                metrics.SHADOW_HITS.labels(ORDERS[order]).inc()
        self.requests += 1
        metrics.ORDER_REQUESTS.labels(ORDERS[self.follows]).inc()
        if self.requests >= HALF_LIFE_TURNOVERS * size:
            other, alone = 1 - self.follows, self.alone
            lead, apart = alone[other] - alone[self.follows], alone[other] + alone[self.follows]
            if lead > self._switch_z * math.sqrt(apart):
                self.follows = other
                metrics.ORDER_FOLLOWED.set(1 - other)
                metrics.ORDER_SWITCHES.labels(ORDERS[other]).inc()

    @staticmethod
    def _request(shadow: EvictionPolicy, key: bytes, size: int) -> bool:
        """One request to a shadow of `size` keys: whether it hit."""
        if key in shadow:
            shadow.on_access(key)
            return True
        while len(shadow) >= size:
            shadow.on_remove(next(shadow.victims()))
        shadow.on_insert(key)
        return False
