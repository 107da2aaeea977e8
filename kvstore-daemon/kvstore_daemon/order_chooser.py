"""Which order the lowest tier follows, the predictive order or LRU, chosen online by
shadow caches on a sample of the keys (SHARDS, Waldspurger et al., FAST'15).

A key is sampled when its hash falls below `sample_share` of the hash range, so the
sample is the same whatever the order of requests. Each sampled key a lookup asks for is
a request to two shadow caches that hold no data, one per order, each as large as
`sample_share` of the chunks the store holds: a shadow that holds the key counts a hit;
one that does not takes it in when the client stores it (it computes what the store
missed), or at once if the store held it (then nothing is stored). The requests are what
lookups ask for, not what the store held: fed by the store's own reads and new chunks,
the shadows saw only the chains the store had kept whole, and in a one-tier model of
Mooncake's 10 minutes at 1% / 10% a chooser started on LRU never left it (10.6% vs
12.5%; fed by lookups, 12.6%). Taking a miss in at the lookup rather than at the store
made an LRU shadow hit 8.0% instead of LRU's 10.2% there (a turn's service time ages
its chunks). The shadows see one tier (DRAM and SSD together), the same for both, so
what they compare is the orders, not the tiers' structure.

Hit scores decay by half every `HALF_LIFE_TURNOVERS` times the shadows' size in sampled
requests (a sliding window of about as many store turnovers). The tier follows the
order whose score leads by more than `MARGIN` (hysteresis: near-equal orders do not
flap), after a warm-up of one window. Nothing here reads the future: a shadow learns
what a request hits only when it comes.

Why shadows, not regrets: LeCaR's regrets (a chunk stored again soon after an order
evicted it) drove the weight to LRU on Mooncake's conversation trace, where the
predictive order alone closes 3-5x more of the gap to the optimum (docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstore_daemon import metrics
from kvstore_daemon.chunk_lives import ChunkLives

if TYPE_CHECKING:  # eviction.py builds the chooser
    from kvstore_daemon.eviction import EvictionPolicy

ORDERS = ("predictive", "lru")
HALF_LIFE_TURNOVERS = 2  # score half-life, in shadow sizes of sampled requests
MARGIN = 0.02  # the other order must lead by 2% of the current one's score to take over
MIN_SHADOW_KEYS = 8


class OrderChooser:
    def __init__(self, lives: ChunkLives, sample_share: float, shadows: tuple[EvictionPolicy, EvictionPolicy]) -> None:
        """`lives` is the store's (its births and reads are the requests); `shadows` are empty
        instances of the orders (ORDERS), the predictive one with lives of its own (it learns
        from the sample)."""
        if not 0 < sample_share <= 1:
            raise ValueError("sample_share must be in (0, 1]")
        self._lives = lives
        self._share = sample_share
        self._below = int(sample_share * (1 << 64))
        self._shadows = shadows
        self.scores = [0.0, 0.0]  # decayed shadow hits per order (ORDERS)
        self.requests = 0  # sampled requests seen
        self.follows = 0  # index into ORDERS
        lives.born.append(self._stored)
        metrics.ORDER_FOLLOWED.set(1)
        for order in ORDERS:
            metrics.SHADOW_HITS.labels(order)  # exported from the start, zeros included

    @property
    def predictive(self) -> bool:
        return self.follows == 0

    def _sampled(self, key: bytes) -> bool:
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") < self._below

    def looked_up(self, keys: Sequence[bytes], found: int) -> None:
        """A lookup asked for `keys`, root first, and the store held the first `found`."""
        for index, key in enumerate(keys):
            if self._sampled(key):
                self._requested(key, take_in=index < found)

    def _stored(self, key: bytes) -> None:
        """`key` entered the store: shadows that lack it take it in."""
        if self._sampled(key):
            size = self._size()
            for shadow in self._shadows:
                if key not in shadow:
                    self._take_in(shadow, key, size)

    def _size(self) -> int:
        return max(MIN_SHADOW_KEYS, round(self._share * len(self._lives.lives)))

    def _requested(self, key: bytes, take_in: bool) -> None:
        """One request; a shadow that misses takes the key in now if the store held it (the
        client will not store it again), else when the client stores it (`_stored`)."""
        size = self._size()
        decay = 0.5 ** (1 / (HALF_LIFE_TURNOVERS * size))
        for order, shadow in enumerate(self._shadows):
            hit = key in shadow
            if hit:
                shadow.on_access(key)
                metrics.SHADOW_HITS.labels(ORDERS[order]).inc()
            elif take_in:
                self._take_in(shadow, key, size)
            self.scores[order] = self.scores[order] * decay + hit
        self.requests += 1
        if self.requests >= HALF_LIFE_TURNOVERS * size:
            other = 1 - self.follows
            if self.scores[other] > self.scores[self.follows] * (1 + MARGIN):
                self.follows = other
                metrics.ORDER_FOLLOWED.set(1 - other)

    @staticmethod
    def _take_in(shadow: EvictionPolicy, key: bytes, size: int) -> None:
        while len(shadow) >= size:
            shadow.on_remove(next(shadow.victims()))
        shadow.on_insert(key)
