"""Ends shared-memory read leases without a round trip of their own: finished leases
ride on the next GetShm (`release_lease_ids`), and a short timer flushes them with one
ReleaseLease when no read follows. A lease that is never released expires anyway."""

from __future__ import annotations

import asyncio
import contextlib

from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc

FLUSH_DELAY_SECONDS = 0.02


class LeaseReleaser:
    def __init__(self, stub: kvstore_pb2_grpc.KVStoreStub, timeout_seconds: float) -> None:
        self._stub = stub
        self._timeout_seconds = timeout_seconds
        self._pending: list[int] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()

    def take(self) -> list[int]:
        """The finished leases, for the next GetShm to end."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        return pending

    def release(self, lease_id: int) -> None:
        self._pending.append(lease_id)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_DELAY_SECONDS, self._start_flush)

    def _start_flush(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def flush(self) -> None:
        lease_ids = self.take()
        if lease_ids:
            with contextlib.suppress(Exception):  # best effort: leases also expire on their own
                request = kvstore_pb2.ReleaseLeaseRequest(lease_ids=lease_ids)
                await self._stub.ReleaseLease(request, timeout=self._timeout_seconds)

    async def close(self) -> None:
        await self.flush()
        if self._flushes:
            await asyncio.wait(self._flushes)
