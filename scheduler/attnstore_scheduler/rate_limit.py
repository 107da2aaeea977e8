"""Per-tenant request rate limit: a token bucket per tenant, in this process.

With several scheduler replicas each enforces the limit on its own share of the calls
(a tenant may reach replicas x the rate); the queue length limit bounds the total load.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from attnstore.errors import Overloaded
from attnstore.token_buckets import TokenBuckets


class RateLimited(Overloaded):
    """A tenant called above its rate; it may call again after `retry_after_ms`."""


class RateLimiter:
    def __init__(
        self, rate_per_second: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_second = rate_per_second
        self.burst = burst
        self._buckets = TokenBuckets(rate_per_second, burst, clock)

    def check(self, tenant: str) -> None:
        """Takes one call from the tenant's bucket, or raises RateLimited (RESOURCE_EXHAUSTED
        with the wait until the bucket holds a call again as retry-after-ms)."""
        wait_seconds = self._buckets.take(tenant)
        if wait_seconds:
            raise RateLimited(
                f"tenant {tenant!r} exceeded its rate of {self.rate_per_second:g} calls per second "
                f"(burst {self.burst}); retry in {wait_seconds:.2f}s",
                retry_after_ms=math.ceil(wait_seconds * 1000),
            )
