"""The per-tenant token bucket."""

from __future__ import annotations

import pytest
from fake_clock import FakeClock

from attnstore.errors import Overloaded, ResourceExhausted
from attnstore_scheduler.rate_limit import RateLimiter


def test_a_burst_then_the_rate_per_tenant() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_second=2.0, burst=3, clock=clock)
    for _ in range(3):
        limiter.check("acme")
    with pytest.raises(ResourceExhausted, match="2 calls per second"):
        limiter.check("acme")
    limiter.check("globex")  # each tenant has its own bucket

    clock.now += 0.5  # one call's worth refilled
    limiter.check("acme")
    with pytest.raises(ResourceExhausted, match="retry in 0.50s") as refused:
        limiter.check("acme")
    assert isinstance(refused.value, Overloaded) and refused.value.retry_after_ms == 500  # retry-after-ms
    clock.now += 100  # never more than the burst
    for _ in range(3):
        limiter.check("acme")
    with pytest.raises(ResourceExhausted):
        limiter.check("acme")
