"""Per-tenant request rate limit: a token bucket per tenant, in this process.

With several scheduler replicas each enforces the limit on its own share of the calls
(a tenant may reach replicas x the rate); the queue length limit bounds the total load.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from attnstore.errors import ResourceExhausted
from attnstore.token_buckets import TokenBuckets


class RateLimited(ResourceExhausted):
    """A tenant called above its rate; it may call again after `retry_after_seconds`."""

    def __init__(self, message: str, retry_after_seconds: float) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class RateLimiter:
    def __init__(
        self, rate_per_second: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_second = rate_per_second
        self.burst = burst
        self._buckets = TokenBuckets(rate_per_second, burst, clock)

    def check(self, tenant: str) -> None:
        """Takes one call from the tenant's bucket, or raises ResourceExhausted."""
        wait_seconds = self._buckets.take(tenant)
        if wait_seconds:
            raise RateLimited(
                f"tenant {tenant!r} exceeded its rate of {self.rate_per_second:g} calls per second "
                f"(burst {self.burst}); retry in {wait_seconds:.2f}s",
                wait_seconds,
            )
