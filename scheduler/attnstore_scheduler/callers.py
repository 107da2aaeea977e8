"""Admits a call to either public API (gRPC and the OpenAI-compatible HTTP one): who the
caller is, then one call taken from its tenant's rate. One gate for both, so that the two
APIs cannot authenticate or limit differently."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnstore_scheduler.auth import DEV_TENANT, ApiKeys, Principal
from attnstore_scheduler.rate_limit import RateLimiter


@dataclass(frozen=True)
class Callers:
    api_keys: ApiKeys | None  # None: authentication off, every caller is tenant 'default'
    rate_limiter: RateLimiter

    def admit(self, metadata: Sequence[tuple[str, str | bytes]]) -> Principal:
        """The caller (`authorization: Bearer <key>` or `x-api-key`), one call taken from
        its tenant's rate; Unauthenticated or RateLimited otherwise."""
        principal = Principal(DEV_TENANT) if self.api_keys is None else self.api_keys.authenticate(metadata)
        self.rate_limiter.check(principal.tenant)
        return principal
