"""The server's call limit: slots held while a call runs, refusals that say which limit
and when to retry, and shedding logged at most once per period."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from attnstore.errors import Overloaded, ResourceExhausted
from attnstore.server.concurrency import ConcurrencyLimit, ServingLimits


def test_calls_beyond_the_limit_are_refused_and_shedding_is_logged_once_per_period() -> None:
    now = [0.0]
    limit = ConcurrencyLimit(
        ServingLimits(max_concurrent_rpcs=2, overload_retry_after_ms=300, shed_log_interval_seconds=10),
        clock=lambda: now[0],
    )
    with capture_logs() as logs, limit.admit("Chat"), limit.admit("Chat"):
        for _ in range(5):
            with pytest.raises(Overloaded, match="maximum of 2 calls") as refused, limit.admit("Chat"):
                pass
            assert isinstance(refused.value, ResourceExhausted) and refused.value.retry_after_ms == 300
        now[0] = 10.0
        with pytest.raises(Overloaded), limit.admit("Get"):
            pass
    assert [(line["event"], line["refused"]) for line in logs] == [("rpcs_shed", 1), ("rpcs_shed", 5)]
    assert limit.running == 0
    with limit.admit("Chat"):  # slots are given back when calls end
        assert limit.running == 1
