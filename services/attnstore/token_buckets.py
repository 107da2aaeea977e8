"""Token buckets by key (a tenant, a calling host), in this process: `burst` calls at once,
`rate_per_second` sustained. Used by the scheduler's per-tenant request limit and the
daemon's per-caller limit on new namespaces."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    refilled_at: float


class TokenBuckets:
    def __init__(
        self, rate_per_second: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_second = rate_per_second
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._swept_at = clock()

    def take(self, key: str) -> float:
        """Takes one token of `key`: 0.0, or (taking none) the seconds until one is there."""
        now = self._clock()
        self._drop_full(now)
        bucket = self._buckets.setdefault(key, _Bucket(float(self.burst), now))
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.refilled_at) * self.rate_per_second)
        bucket.refilled_at = now
        if bucket.tokens < 1.0:
            return (1.0 - bucket.tokens) / self.rate_per_second
        bucket.tokens -= 1.0
        return 0.0

    def _drop_full(self, now: float) -> None:
        """Bounds the map: a bucket idle long enough to be full again says nothing a new
        one would not."""
        refill_seconds = self.burst / self.rate_per_second
        if now - self._swept_at < refill_seconds:
            return
        self._swept_at = now
        for key in [k for k, b in self._buckets.items() if now - b.refilled_at >= refill_seconds]:
            del self._buckets[key]
