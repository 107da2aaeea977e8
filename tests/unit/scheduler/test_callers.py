"""The one gate both public APIs admit calls through: the caller, then its tenant's rate."""

from __future__ import annotations

import pytest
from fake_clock import FakeClock

from attnstore.errors import ResourceExhausted, Unauthenticated
from attnstore_scheduler.auth import ApiKeys, Principal, hash_key
from attnstore_scheduler.callers import Callers
from attnstore_scheduler.rate_limit import RateLimiter


def test_without_keys_every_caller_is_the_default_tenant_and_is_rate_limited() -> None:
    callers = Callers(None, RateLimiter(rate_per_second=1.0, burst=1, clock=FakeClock()))
    assert callers.admit([]) == Principal("default")
    with pytest.raises(ResourceExhausted):
        callers.admit([("x-api-key", "anything")])


def test_with_keys_the_key_names_the_tenant_whose_rate_is_taken() -> None:
    keys = ApiKeys({"acme": [hash_key("k1")], "globex": [hash_key("k2")]}, admin_tenant="ops")
    callers = Callers(keys, RateLimiter(rate_per_second=1.0, burst=1, clock=FakeClock()))
    assert callers.admit([("authorization", "Bearer k1")]).tenant == "acme"
    assert callers.admit([("x-api-key", "k2")]).tenant == "globex"  # its own bucket
    with pytest.raises(ResourceExhausted):
        callers.admit([("x-api-key", "k1")])
    with pytest.raises(Unauthenticated):
        callers.admit([("x-api-key", "unknown")])
