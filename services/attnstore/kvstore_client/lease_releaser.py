"""Ends shared-memory read leases and reports lease-free reads without a round trip of
their own: finished leases ride on the next GetShm (`release_lease_ids`), and a short
timer flushes what is left with one ReleaseLease, which also carries the chunks copied
without a lease since the last flush (so the daemon counts them and keeps them recent).
A lease that is never released expires anyway."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc

FLUSH_DELAY_SECONDS = 0.02
MAX_REPORTED_KEYS = 1024  # per ReleaseLease; well under the daemon's max_keys_per_request default


class LeaseReleaser:
    def __init__(self, stub: kvstore_pb2_grpc.KVStoreStub, timeout_seconds: float) -> None:
        self._stub = stub
        self._timeout_seconds = timeout_seconds
        self._pending: list[int] = []
        self._reads: dict[bytes, dict[bytes, None]] = {}  # namespace -> keys, in order, once each
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()

    def take(self) -> list[int]:
        """The finished leases, for the next GetShm to end."""
        if self._timer is not None and not self._reads:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        return pending

    def release(self, lease_id: int) -> None:
        self._pending.append(lease_id)
        self._schedule()

    def note_reads(self, namespace: bytes, keys: Sequence[bytes]) -> None:
        """Chunks just copied without a lease, for the next flush to report."""
        self._reads.setdefault(namespace, {}).update(dict.fromkeys(keys))
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_DELAY_SECONDS, self._start_flush)

    def _start_flush(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    def _take_reads(self) -> list[kvstore_pb2.LeaseFreeReads]:
        """Up to MAX_REPORTED_KEYS of the reads noted; the rest wait for the next flush."""
        taken: list[kvstore_pb2.LeaseFreeReads] = []
        budget = MAX_REPORTED_KEYS
        for namespace in list(self._reads):
            keys = self._reads[namespace]
            batch = list(keys)[:budget]
            for key in batch:
                del keys[key]
            if not keys:
                del self._reads[namespace]
            taken.append(kvstore_pb2.LeaseFreeReads(namespace=namespace, keys=batch))
            budget -= len(batch)
            if not budget:
                break
        return taken

    async def flush(self) -> None:
        lease_ids, reads = self.take(), self._take_reads()
        if self._reads:
            self._schedule()
        if lease_ids or reads:
            with contextlib.suppress(Exception):  # best effort: leases also expire on their own
                request = kvstore_pb2.ReleaseLeaseRequest(lease_ids=lease_ids, lease_free_reads=reads)
                await self._stub.ReleaseLease(request, timeout=self._timeout_seconds)

    async def settle(self) -> None:
        """Returns once every lease released so far has ended at the daemon (flushed now or
        by a flush in flight)."""
        while self._pending or self._reads:
            await self.flush()
        if self._flushes:
            await asyncio.wait(self._flushes)

    async def close(self) -> None:
        await self.settle()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
