"""Per-tenant request rate limit: a token bucket per tenant, in this process.

With several scheduler replicas each enforces the limit on its own share of the calls
(a tenant may reach replicas x the rate); the queue length limit bounds the total load.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from attnstore.errors import Overloaded

# Buckets of tenants idle this long are full again; dropping them bounds the map's size.
_IDLE_SECONDS = 300.0


@dataclass
class _Bucket:
    tokens: float
    refilled_at: float


class RateLimiter:
    def __init__(
        self, rate_per_second: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_second = rate_per_second
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._swept_at = clock()

    def check(self, tenant: str) -> None:
        """Takes one call from the tenant's bucket, or raises Overloaded (RESOURCE_EXHAUSTED
        with the wait until the bucket holds a call again as retry-after-ms)."""
        now = self._clock()
        self._drop_idle(now)
        bucket = self._buckets.setdefault(tenant, _Bucket(float(self.burst), now))
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.refilled_at) * self.rate_per_second)
        bucket.refilled_at = now
        if bucket.tokens < 1.0:
            wait_seconds = (1.0 - bucket.tokens) / self.rate_per_second
            raise Overloaded(
                f"tenant {tenant!r} exceeded its rate of {self.rate_per_second:g} calls per second "
                f"(burst {self.burst}); retry in {wait_seconds:.2f}s",
                retry_after_ms=math.ceil(wait_seconds * 1000),
            )
        bucket.tokens -= 1.0

    def _drop_idle(self, now: float) -> None:
        if now - self._swept_at < _IDLE_SECONDS:
            return
        self._swept_at = now
        for tenant in [t for t, b in self._buckets.items() if now - b.refilled_at > _IDLE_SECONDS]:
            del self._buckets[tenant]
