"""This daemon as a member of the pool's ledger (attnstore/pool_ledger.py): a heartbeat
that publishes its addresses and free space, and the peer finder of its peer tier (the
ledger's candidates: another daemon on this node first, then the roomiest).

It reports the bytes it holds for borrowers (the chunk index counts them by ReservePut's
borrower), so the ledger's ceiling (LendingLimits.max_lent_fraction) holds; the chunk
store refuses a borrowed chunk past the limits itself, whatever the ledger last heard.

Each heartbeat also tells borrowers which of their chunks this daemon evicted, and
forgets the placements its own lenders evicted (through the ledger: the borrower's node
is all a lender knows of it), so a borrower's Lookup stops offering a chunk within a
heartbeat instead of a read failing on it. Only a daemon that borrows (pool_capacity_bytes)
takes its node's reports; two that both borrow on one node share them, and one may take
the other's, which then finds out on read as before (give each its own pool_node).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from attnstore.pool_ledger import DaemonEntry, PoolLedger
from kvstore_daemon.settings import DaemonSettings
from kvstore_daemon.tier import Tier

log = structlog.get_logger("kvstore_daemon.pool")

_CANDIDATES = 3  # peers asked in turn for one chunk
_MISSED_HEARTBEATS = 3  # the ledger forgets a daemon after this many


class PoolStore(Protocol):
    """What the member needs of the chunk store (chunk_store.py)."""

    @property
    def lent_bytes(self) -> int: ...

    @property
    def pinned_lent_bytes(self) -> int: ...

    def take_dropped_borrowed(self) -> list[tuple[str, bytes]]: ...

    def forget_peer_copies(self, peer: str, keys: Sequence[bytes]) -> int: ...


class PoolMember:
    def __init__(self, settings: DaemonSettings, lending_tier: Tier) -> None:
        """`lending_tier`: the tier borrowed chunks take (the SSD), whose capacity and use
        it reports: the ledger ranks lenders by the room a borrowed chunk may really take."""
        assert settings.pool_redis_url is not None
        self._settings = settings
        self._lending_tier = lending_tier
        self._redis = aioredis.Redis.from_url(settings.pool_redis_url)
        self._ledger = PoolLedger(
            self._redis,
            settings.pool_heartbeat_seconds * _MISSED_HEARTBEATS,
            settings.lending_limits,
        )
        self._grpc_address = ""  # known once the server is bound (`start`)
        self._store: PoolStore | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, grpc_port: int, data_plane_port: int, store: PoolStore) -> None:
        """Joins the ledger, reporting what `store` holds for borrowers."""
        self._store = store
        host = self._settings.listen_address.rsplit(":", 1)[0]
        self._grpc_address = self._settings.pool_advertise_address or f"{host}:{grpc_port}"
        self._data_plane_address = f"{self._grpc_address.rsplit(':', 1)[0]}:{data_plane_port}"
        self._task = asyncio.get_running_loop().create_task(self._beat_forever())

    @property
    def address(self) -> str:
        """Its id and gRPC address in the ledger ("" until started)."""
        return self._grpc_address

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self._ledger.forget(self._grpc_address)
        except RedisError as exc:  # the ledger forgets it after its TTL anyway
            log.info("pool_leave_failed", error=str(exc))
        await self._redis.aclose()

    async def find_peers(self, size_bytes: int) -> Sequence[str]:
        """gRPC addresses of peers that may take `size_bytes`, best first ([] until started
        or while Redis is unreachable: the chunk is then deleted as without a pool)."""
        if not self._grpc_address:
            return []
        try:
            return [
                e.grpc_address for e in await self._ledger.candidates(self._entry(), size_bytes, _CANDIDATES)
            ]
        except RedisError as exc:
            log.info("pool_ledger_unreachable", error=str(exc))
            return []

    def _entry(self) -> DaemonEntry:
        capacity, used = self._lending_tier.capacity_bytes, self._lending_tier.used_bytes
        return DaemonEntry(
            daemon_id=self._grpc_address, node=self._settings.pool_node_name,
            grpc_address=self._grpc_address, data_plane_address=self._data_plane_address,
            capacity_bytes=capacity, free_bytes=max(0, capacity - used),
            lent_bytes=self._store.lent_bytes if self._store is not None else 0,
            pinned_lent_bytes=self._store.pinned_lent_bytes if self._store is not None else 0,
        )  # fmt: skip

    async def _beat_forever(self) -> None:
        while True:
            try:
                await self._ledger.heartbeat(self._entry())
                await self._exchange_drops()
            except RedisError as exc:  # keeps beating: Redis may come back
                log.info("pool_heartbeat_failed", error=str(exc))
            await asyncio.sleep(self._settings.pool_heartbeat_seconds)

    async def _exchange_drops(self) -> None:
        """Tells borrowers what this daemon evicted of theirs; forgets what lenders evicted
        of ours (reports lost with Redis are found out on read instead)."""
        assert self._store is not None
        if drops := self._store.take_dropped_borrowed():
            await self._ledger.report_dropped(self._grpc_address, drops)
        if not self._settings.pool_capacity_bytes:  # borrows nothing: the reports are another daemon's
            return
        by_lender: dict[str, list[bytes]] = {}
        for lender, key in await self._ledger.take_dropped(self._settings.pool_node_name):
            by_lender.setdefault(lender, []).append(key)
        for lender, keys in by_lender.items():
            self._store.forget_peer_copies(lender, keys)
