"""Session lifecycle: create, read, list, delete, expire, and releasing the KV of a
session that ended.

Releasing (deletion, expiry, or the session moving to another node) tells the node's
daemon that the chunks are no longer needed: Unpin removes any pin, and the releaser (the
hint pusher) hints them EVICT_FIRST, at the front of its eviction order, with each of its
pushes for a while: a hint sent on its own would be wiped by the pusher's next replace
of that namespace's hints. Nothing is deleted outright: another
session of the tenant may share a prefix (a system prompt), and the look-ahead hints of
its queued turns protect that prefix again. A daemon that does not answer only costs
cache space (its eviction reclaims the chunks anyway), so a release never fails a call.

A tenant's sessions may hold at most `max_kv_bytes_per_tenant` of KV, counted as their
history tokens times the model's KV bytes per token (what the daemon stores for them,
whole chunks or not). A turn that would take the tenant past it is refused before it
runs; turns of one tenant running at once may each pass, overshooting by their own size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Protocol

import grpc
import structlog

from attnstore.errors import NotFound, ResourceExhausted
from attnstore_scheduler import metrics
from attnstore_scheduler.session_activity import Expectation, SessionActivity
from attnstore_scheduler.session_record import Message, SessionIds, SessionRecord
from attnstore_scheduler.session_store import SessionStore
from attnstore_scheduler.worker_registry import WorkerRegistry

log = structlog.get_logger("attnstore_scheduler.sessions")

_SWEEP_BATCH = 100


class ChunkReleaser(Protocol):
    """Hints chunks EVICT_FIRST on a node from now on (hint_pusher.HintPusher)."""

    def release(self, node: str, namespace: bytes, keys: Iterable[bytes]) -> None: ...


class Sessions:
    def __init__(
        self,
        store: SessionStore,
        registry: WorkerRegistry,
        releaser: ChunkReleaser,
        *,
        max_sessions_per_tenant: int,
        max_kv_bytes_per_tenant: int | None = None,
        activity: SessionActivity | None = None,
    ) -> None:
        """`max_kv_bytes_per_tenant` None: no limit beyond the session count. `activity`
        (the predictive policy) hears of every turn, expectation and end."""
        self.activity = activity
        self.store = store
        self._registry = registry
        self._releaser = releaser
        self._max_sessions_per_tenant = max_sessions_per_tenant
        self._max_kv_bytes_per_tenant = max_kv_bytes_per_tenant
        self._ids = SessionIds()

    async def create(self, tenant: str, system_prompt: str, ttl_seconds: int) -> SessionRecord:
        record = SessionRecord.new(
            self._ids, tenant, ttl_seconds, (Message("system", system_prompt),) if system_prompt else ()
        )
        await self.store.create(record, self._max_sessions_per_tenant)
        metrics.SESSIONS_CREATED.inc()
        log.info("session_created", tenant=tenant, session_id=record.session_id, ttl_seconds=ttl_seconds)
        return record

    async def get(self, tenant: str, session_id: str) -> SessionRecord:
        record = await self.store.get(tenant, session_id)
        if record is None:
            raise not_found(session_id)
        return record

    async def list(self, tenant: str, after_id: str, limit: int) -> list[SessionRecord]:
        """Up to `limit` live sessions of the tenant with ids above `after_id`, by id."""
        return await self.store.list(tenant, after_id, limit)

    async def check_kv_budget(
        self, record: SessionRecord, tokens_after_turn: int, kv_bytes_per_token: int
    ) -> None:
        """ResourceExhausted when the session growing to `tokens_after_turn` would take its
        tenant past max_kv_bytes_per_tenant (see the module doc)."""
        limit = self._max_kv_bytes_per_tenant
        if limit is None:
            return
        stored = await self.store.stored_tokens(record.tenant)
        after = (stored - len(record.token_ids) + tokens_after_turn) * kv_bytes_per_token
        if after > limit:
            raise ResourceExhausted(
                f"tenant {record.tenant!r} would hold {after} bytes of session KV after this turn, over its "
                f"limit of {limit} (max_kv_bytes_per_tenant); delete sessions or let them expire"
            )

    async def delete(self, tenant: str, session_id: str) -> int:
        """Ends the session; the chunks released on its daemon."""
        record = await self.store.delete(tenant, session_id)
        if record is None:
            raise not_found(session_id)
        released = await self.release(record)
        self.note_ended(tenant, session_id)
        metrics.SESSIONS_ENDED.labels("deleted").inc()
        if record.expires_at <= time.time():
            raise not_found(session_id)  # it had expired: gone for the caller too
        log.info("session_deleted", tenant=tenant, session_id=session_id, released_chunks=released)
        return released

    async def release(self, record: SessionRecord, node: str | None = None) -> int:
        """Releases the session's chunks on `node` (default: the node holding them)."""
        node = node or record.node
        daemon = self._registry.daemon(node) if node else None
        if daemon is None or not record.chunk_keys:
            return 0
        keys = list(record.chunk_keys)
        self._releaser.release(node, record.namespace, keys)
        try:
            await daemon.unpin(record.namespace, keys)
        except grpc.aio.AioRpcError as exc:
            log.warning("release_failed", session_id=record.session_id, node=node, code=exc.code().name)
            return 0
        metrics.RELEASED_CHUNKS.inc(len(keys))
        return len(keys)

    def expect(self, tenant: str, session_id: str, expectation: Expectation | None) -> None:
        """The application's word on the session's next turn (validation.check_expectation)."""
        if self.activity is not None and expectation is not None:
            self.activity.expect(activity_id(tenant, session_id), expectation, time.monotonic())

    def note_ended(self, tenant: str, session_id: str) -> None:
        if self.activity is not None:
            self.activity.ended(activity_id(tenant, session_id), time.monotonic())

    async def sweep_expired(self) -> int:
        """Ends every session expired by now; how many."""
        ended = 0
        while batch := await self.store.claim_expired(time.time(), _SWEEP_BATCH):
            await asyncio.gather(*(self.release(record) for record in batch))
            for record in batch:
                self.note_ended(record.tenant, record.session_id)
                log.info("session_expired", tenant=record.tenant, session_id=record.session_id)
            metrics.SESSIONS_ENDED.labels("expired").inc(len(batch))
            ended += len(batch)
        return ended

    async def sweep_forever(self, interval_seconds: float) -> None:
        while True:
            try:
                await self.sweep_expired()
            except Exception:  # Redis may be down: the next sweep retries
                log.exception("expiry_sweep_failed")
            await asyncio.sleep(interval_seconds)


def activity_id(tenant: str, session_id: str) -> str:
    """A session's name in SessionActivity (ids are unique per tenant only)."""
    return f"{tenant}/{session_id}"


def not_found(session_id: str) -> NotFound:
    # The same answer whether the session never existed, expired, or is another tenant's.
    return NotFound(f"session {session_id} not found")
