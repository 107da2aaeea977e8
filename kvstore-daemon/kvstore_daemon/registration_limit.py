"""Per-caller rate limit on registering new namespaces: a token bucket per caller, so a
worker's burst at start passes while a client registering namespaces in a loop cannot
fill the namespace table in a second (issue 26: 1,022 took about one)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from attnstore.errors import ResourceExhausted

_MAX_CALLERS = 4096  # buckets kept; full (idle) ones are dropped first when there are more


class RegistrationRateLimited(ResourceExhausted):
    """The caller registered new namespaces faster than its rate allows."""


@dataclass
class _Bucket:
    tokens: float
    updated_at: float


class RegistrationLimit:
    def __init__(
        self, per_second: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._per_second = per_second
        self._burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, caller: str) -> None:
        """Spends one registration of `caller`; raises RegistrationRateLimited if none is left."""
        now = self._clock()
        bucket = self._buckets.get(caller)
        if bucket is None:
            self._forget_idle(now)
            bucket = self._buckets[caller] = _Bucket(float(self._burst), now)
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.updated_at) * self._per_second)
        bucket.updated_at = now
        if bucket.tokens < 1:
            wait_seconds = (1 - bucket.tokens) / self._per_second
            raise RegistrationRateLimited(
                f"{caller} registers new namespaces faster than {self._per_second:g}/s "
                f"(namespace_registrations_per_second, burst {self._burst}); retry in {wait_seconds:.2f}s"
            )
        bucket.tokens -= 1

    def _forget_idle(self, now: float) -> None:
        """Bounds memory: buckets refilled to the burst say nothing a new bucket would not."""
        if len(self._buckets) < _MAX_CALLERS:
            return
        for caller, bucket in list(self._buckets.items()):
            if bucket.tokens + (now - bucket.updated_at) * self._per_second >= self._burst:
                del self._buckets[caller]
        if len(self._buckets) >= _MAX_CALLERS:  # all busy: forget the longest-unseen
            del self._buckets[min(self._buckets, key=lambda c: self._buckets[c].updated_at)]
