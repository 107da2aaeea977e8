"""Bounds the calls a server runs at once. Beyond the bound a call is refused at once with
RESOURCE_EXHAUSTED, a message saying which limit, and the trailing metadata
`retry-after-ms`, instead of piling up until clients time out or the transport cancels
them (a flood of 3,000-10,000 calls got CANCELLED with no message and no log line).
Health checks and reflection are never counted or refused: a busy server is not a dead
one. Shedding is logged at most once per `shed_log_interval_seconds`, with the count."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import structlog
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field

from attnstore.errors import Overloaded

log = structlog.get_logger("attnstore.server.concurrency")

SHED_RPCS = Counter(
    "attnstore_rpcs_shed_total", "Calls refused because the server ran its maximum", ["method"]
)

# Services whose calls are never limited (probes and tooling must answer under load).
UNLIMITED_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class CallLimitReached(Overloaded):
    """Refused by the server's call limit (logged here, at most once per period)."""


class ServingLimits(BaseModel):
    """Load limits of a service's gRPC server (nested in each service's settings as `serving`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrent_rpcs: int = Field(
        1024, ge=1, description="calls the server runs at once (streams until they end); more are refused"
    )
    max_pending_rpcs: int = Field(
        100_000,
        ge=1,
        description="calls received but not yet taken up by the server (a flood's backlog); beyond it "
        "gRPC drops calls as a bare CANCELLED",
    )
    max_pending_seconds: int = Field(
        600,
        ge=1,
        description="longest a received call may wait to be taken up; then gRPC drops it as CANCELLED",
    )
    overload_retry_after_ms: int = Field(
        500, ge=0, description="retry hint sent with a refused call (trailing metadata retry-after-ms)"
    )
    shed_log_interval_seconds: float = Field(
        10.0, gt=0, description="at most one log line about refused calls per this period"
    )


class ConcurrencyLimit:
    """Counts the running calls; every method runs on the server's event loop."""

    def __init__(self, limits: ServingLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self._limits = limits
        self._clock = clock
        self.running = 0
        self._shed_since_log = 0
        self._last_log = float("-inf")

    @contextlib.contextmanager
    def admit(self, method: str) -> Iterator[None]:
        """Holds one of the server's call slots; CallLimitReached when none is free."""
        limit = self._limits.max_concurrent_rpcs
        if self.running >= limit:
            self._shed(method)
            retry_ms = self._limits.overload_retry_after_ms
            raise CallLimitReached(
                f"the server is running its maximum of {limit} calls (serving.max_concurrent_rpcs); "
                f"retry in {retry_ms} ms",
                retry_after_ms=retry_ms,
            )
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1

    def _shed(self, method: str) -> None:
        SHED_RPCS.labels(method).inc()
        self._shed_since_log += 1
        now = self._clock()
        if now - self._last_log >= self._limits.shed_log_interval_seconds:
            log.warning(
                "rpcs_shed",
                refused=self._shed_since_log,
                max_concurrent_rpcs=self._limits.max_concurrent_rpcs,
                last_method=method,
            )
            self._shed_since_log = 0
            self._last_log = now
