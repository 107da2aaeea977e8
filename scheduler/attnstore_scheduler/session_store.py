"""Where sessions live: the SessionStore interface and its embedded (in-process)
implementation; redis_session_store.py has the Redis one. Both behave the same:

- A session is visible until `expires_at` (last turn + TTL); `save` after a turn moves it.
- Expiry is found by `claim_expired`, polled by the expiry sweeper: it hands each expired
  session to exactly one caller (removing it), so its KV is released once. A session whose
  turn lock is held never expires under that turn.
- `turn_lock` serializes the turns of one session; the Redis lock carries a TTL renewed
  while the turn runs, so a scheduler that dies mid-turn cannot block the session.
- `save` never brings back a session deleted (or expired) meanwhile: it answers False.
- `stored_tokens` sums the history tokens of a tenant's sessions until each is deleted or
  claimed (the per-tenant KV limit, sessions.py).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import time
from collections.abc import AsyncIterator
from typing import Protocol

from attnstore.errors import ResourceExhausted, Unavailable
from attnstore_scheduler.session_record import SessionRecord


class SessionStore(Protocol):
    async def create(self, record: SessionRecord, max_sessions_per_tenant: int) -> None:
        """Stores a new session; ResourceExhausted when the tenant holds the maximum."""

    async def get(self, tenant: str, session_id: str) -> SessionRecord | None:
        """The session, or None when it does not exist, expired, or is another tenant's."""

    async def save(self, record: SessionRecord) -> bool:
        """Replaces the session and its expiry; False (and nothing stored) when it is gone."""

    async def delete(self, tenant: str, session_id: str) -> SessionRecord | None:
        """Removes the session; what it was, or None when there was none."""

    async def list(self, tenant: str, after_id: str, limit: int) -> list[SessionRecord]:
        """Up to `limit` live sessions of the tenant with ids above `after_id`, by id."""

    async def claim_expired(self, now: float, limit: int) -> list[SessionRecord]:
        """Removes up to `limit` sessions expired at `now` (not in a turn) and returns them."""

    async def stored_tokens(self, tenant: str) -> int:
        """The history tokens of the tenant's sessions, all together."""

    def turn_lock(self, tenant: str, session_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Held for a whole turn; Unavailable when the previous turn holds it too long."""

    async def ping(self) -> None:
        """Raises when the store cannot serve (the health probe)."""

    async def close(self) -> None: ...


def too_many_sessions(tenant: str, limit: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"tenant {tenant!r} holds {limit} sessions, the most allowed; delete some or let them expire"
    )


def lock_timeout(session_id: str, wait_seconds: float) -> Unavailable:
    return Unavailable(
        f"session {session_id} is busy with another turn that did not finish within {wait_seconds:g}s; "
        "retry later"
    )


class _SessionLock:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0  # the holder and the waiters


class EmbeddedSessionStore:
    """Sessions in this process's memory (no Redis): one scheduler replica, and sessions
    are gone when it stops. Single event loop, so no call interleaves with another."""

    def __init__(self, lock_wait_seconds: float) -> None:
        self._lock_wait_seconds = lock_wait_seconds
        self._records: dict[tuple[str, str], SessionRecord] = {}
        self._ids: dict[str, list[str]] = {}  # tenant -> its session ids, sorted
        self._expiries: list[tuple[float, str, str]] = []  # heap; stale entries are skipped
        self._locks: dict[tuple[str, str], _SessionLock] = {}
        self._tokens: dict[str, int] = {}  # tenant -> stored_tokens

    async def create(self, record: SessionRecord, max_sessions_per_tenant: int) -> None:
        ids = self._ids.setdefault(record.tenant, [])
        if len(ids) >= max_sessions_per_tenant:
            raise too_many_sessions(record.tenant, max_sessions_per_tenant)
        bisect.insort(ids, record.session_id)
        self._put(record)

    async def get(self, tenant: str, session_id: str) -> SessionRecord | None:
        record = self._records.get((tenant, session_id))
        return record if record is not None and record.expires_at > time.time() else None

    async def save(self, record: SessionRecord) -> bool:
        if (record.tenant, record.session_id) not in self._records:
            return False
        self._put(record)
        return True

    async def delete(self, tenant: str, session_id: str) -> SessionRecord | None:
        record = self._records.pop((tenant, session_id), None)
        if record is not None:
            ids = self._ids[tenant]
            del ids[bisect.bisect_left(ids, session_id)]
            self._tokens[tenant] -= len(record.token_ids)
        return record

    async def list(self, tenant: str, after_id: str, limit: int) -> list[SessionRecord]:
        ids = self._ids.get(tenant, [])
        now, page = time.time(), []
        for session_id in ids[bisect.bisect_right(ids, after_id) :]:
            record = self._records[(tenant, session_id)]
            if record.expires_at > now:
                page.append(record)
                if len(page) == limit:
                    break
        return page

    async def claim_expired(self, now: float, limit: int) -> list[SessionRecord]:
        claimed: list[SessionRecord] = []
        busy: list[tuple[float, str, str]] = []
        while self._expiries and self._expiries[0][0] <= now and len(claimed) < limit:
            entry = heapq.heappop(self._expiries)
            _, tenant, session_id = entry
            record = self._records.get((tenant, session_id))
            if record is None or record.expires_at > now:
                continue  # deleted, or refreshed (a newer entry is in the heap)
            if (tenant, session_id) in self._locks:  # in a turn: it expires after it, if at all
                busy.append(entry)
                continue
            await self.delete(tenant, session_id)
            claimed.append(record)
        for entry in busy:
            heapq.heappush(self._expiries, entry)
        return claimed

    @contextlib.asynccontextmanager
    async def turn_lock(self, tenant: str, session_id: str) -> AsyncIterator[None]:
        key = (tenant, session_id)
        entry = self._locks.setdefault(key, _SessionLock())
        entry.users += 1
        try:
            try:
                await asyncio.wait_for(entry.lock.acquire(), self._lock_wait_seconds)
            except TimeoutError:
                raise lock_timeout(session_id, self._lock_wait_seconds) from None
            try:
                yield
            finally:
                entry.lock.release()
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._locks[key]  # the map holds only sessions in (or waiting for) a turn

    async def stored_tokens(self, tenant: str) -> int:
        return self._tokens.get(tenant, 0)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _put(self, record: SessionRecord) -> None:
        key = (record.tenant, record.session_id)
        previous = len(self._records[key].token_ids) if key in self._records else 0
        self._tokens[record.tenant] = self._tokens.get(record.tenant, 0) + len(record.token_ids) - previous
        self._records[key] = record
        heapq.heappush(self._expiries, (record.expires_at, record.tenant, record.session_id))
