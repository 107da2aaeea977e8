"""Moving chunks between the DRAM and SSD tiers: allocation with eviction, demotion,
write-through persistence, promotion, watermarks and look-ahead prefetch.

Eviction order comes from the tier's policy; a chunk with readers or a live pin is
never chosen. Evicting a DRAM chunk that has no SSD copy writes one first (demotion);
evicting an SSD chunk that has no DRAM copy removes it from the store.
"""

from __future__ import annotations

import asyncio
import errno
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from attnstore.chunks.format import decode_layout
from attnstore.errors import DataLoss, InvalidArgument, ResourceExhausted
from kvstore_daemon import metrics
from kvstore_daemon.chunk_entry import Chunk, Tier
from kvstore_daemon.chunk_index import ChunkIndex
from kvstore_daemon.dram_tier import DramTier
from kvstore_daemon.eviction import EvictionPolicy, make_policy
from kvstore_daemon.hints import HintAction, HintBook
from kvstore_daemon.namespaces import NamespaceRegistry
from kvstore_daemon.settings import DaemonSettings
from kvstore_daemon.ssd_tier import SsdChunkCorrupt, SsdFullError, SsdTier, SsdWriteError

log = structlog.get_logger("kvstore_daemon.tiers")

VictimFilter = Callable[[Chunk], bool]


class TierMover:
    def __init__(
        self,
        settings: DaemonSettings,
        dram: DramTier,
        ssd: SsdTier,
        chunks: ChunkIndex,
        namespaces: NamespaceRegistry,
        hints: HintBook,
        counts: Counter[str],
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.dram = dram
        self.ssd = ssd
        self.hints = hints
        self.dram_policy: EvictionPolicy = make_policy(settings.eviction_policy, hints)
        self.ssd_policy: EvictionPolicy = make_policy(settings.eviction_policy, hints)
        self._chunks = chunks
        self._namespaces = namespaces
        self._counts = counts
        self._clock = clock
        self._background: set[asyncio.Task[Any]] = set()
        self._persisting: set[asyncio.Task[bool]] = set()

    async def finish_persists(self, timeout_seconds: float) -> None:
        if self._persisting:
            await asyncio.wait(list(self._persisting), timeout=timeout_seconds)

    def cancel_background(self) -> None:
        for task in list(self._background):
            task.cancel()

    def touch(self, chunk: Chunk) -> None:
        if chunk.blocks is not None:
            self.dram_policy.on_access(chunk.key)
        if chunk.on_ssd:
            self.ssd_policy.on_access(chunk.key)

    def free_if_unread(self, chunk: Chunk) -> None:
        """Completes a deferred delete once nobody reads the chunk."""
        if not chunk.deleted or chunk.readers > 0 or not self._chunks.holds(chunk):
            return
        self._chunks.remove(chunk)
        self.drop_dram_copy(chunk)
        if chunk.on_ssd:
            self.ssd_policy.on_remove(chunk.key)
            self.spawn(self.ssd.delete(chunk.key))
            chunk.on_ssd = False

    def drop_dram_copy(self, chunk: Chunk) -> None:
        if chunk.blocks is not None:
            self.dram_policy.on_remove(chunk.key)
            self.dram.free(chunk.blocks)
            chunk.blocks = chunk.extents = None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)



    async def allocate_dram(self, size_bytes: int, may_evict: VictimFilter | None) -> list[int] | None:
        """Blocks for `size_bytes`, evicting (and demoting) as the policy orders; None if
        only unevictable chunks remain. Chunks whose SSD copy is being written cannot be
        evicted until it lands, so those writes are waited for rather than given up on."""
        while not self.dram.can_allocate(size_bytes):
            victim = self._next_victim(self.dram_policy, may_evict)
            if victim is not None:
                await self._evict_from_dram(victim)
            elif self._persisting:
                await asyncio.wait(list(self._persisting), return_when=asyncio.FIRST_COMPLETED)
            else:
                return None
        return self.dram.allocate(size_bytes)

    def _next_victim(self, policy: EvictionPolicy, may_evict: VictimFilter | None) -> Chunk | None:
        now = self._clock()
        for key in policy.victims():
            chunk = self._chunks[key]
            if chunk.readers == 0 and chunk.pinned_until <= now and (may_evict is None or may_evict(chunk)):
                return chunk
        return None

    async def _evict_from_dram(self, chunk: Chunk) -> None:
        if not chunk.on_ssd:
            chunk.readers += 1  # holds the blocks while their bytes are written out
            try:
                demoted = await self.persisted(chunk)
            finally:
                chunk.readers -= 1
            if demoted:
                self._counts["demotion"] += 1
                metrics.DEMOTIONS.inc()
        if chunk.readers > 0 or chunk.blocks is None or not self._chunks.holds(chunk):
            self.free_if_unread(chunk)
            return
        self.drop_dram_copy(chunk)
        self._counts["evict_dram"] += 1
        metrics.EVICTIONS.labels("dram").inc()
        if not chunk.on_ssd:  # SSD refused it: the chunk is gone
            self._chunks.remove(chunk)

    def start_persist(self, chunk: Chunk) -> asyncio.Task[bool]:
        task = chunk.persist_task
        if task is None or (task.done() and (task.cancelled() or task.exception() or not task.result())):
            task = chunk.persist_task = asyncio.get_running_loop().create_task(self._persist(chunk))
            self._persisting.add(task)
            task.add_done_callback(self._persisting.discard)
        return task

    async def persisted(self, chunk: Chunk) -> bool:
        """True once the chunk has an SSD copy (writing it if needed)."""
        if chunk.on_ssd:
            return True
        return await asyncio.shield(self.start_persist(chunk))

    async def _persist(self, chunk: Chunk) -> bool:
        chunk.readers += 1
        try:
            if chunk.blocks is None or chunk.extents is None:
                return False
            data = self.dram.arena.read(chunk.extents, 0, chunk.size_bytes)
            for attempt in range(2):
                if not await self._make_ssd_room(chunk.size_bytes):
                    return False
                try:
                    await self.ssd.write(chunk.key, chunk.namespace, data)
                    break
                except SsdWriteError as exc:
                    metrics.SSD_WRITE_ERRORS.inc()
                    # A full disk (the capacity was more than it holds, or another program
                    # took the space) is pressure: shrink to what it holds, evict, retry once.
                    if exc.errno != errno.ENOSPC or attempt:
                        log.warning("ssd_write_failed", key=chunk.key.hex(), error=str(exc))
                        return False
                    log.info("ssd_full", key=chunk.key.hex(), error=str(exc),
                             capacity_bytes=self.ssd.refresh_capacity())
        except SsdFullError as exc:
            metrics.SSD_WRITE_ERRORS.inc()
            log.warning("ssd_write_failed", key=chunk.key.hex(), error=str(exc))
            return False
        finally:
            chunk.readers -= 1
        chunk.on_ssd = True
        self.ssd_policy.on_insert(chunk.key)
        self.free_if_unread(chunk)
        return True

    async def _make_ssd_room(self, size_bytes: int) -> bool:
        """Evicts SSD chunks until `size_bytes` fit; False if only unevictable ones remain
        (after checking whether the disks have more room than last seen)."""
        refreshed = False
        while self.ssd.used_bytes + size_bytes > self.ssd.capacity_bytes:
            victim = self._next_victim(self.ssd_policy, None)
            if victim is None:
                if refreshed:
                    return False
                self.ssd.refresh_capacity()
                refreshed = True
                continue
            await self._evict_from_ssd(victim)
        return True

    async def _evict_from_ssd(self, chunk: Chunk) -> None:
        self.ssd_policy.on_remove(chunk.key)
        chunk.on_ssd = False
        if chunk.blocks is None:  # no DRAM copy: the chunk leaves the store
            self._chunks.remove(chunk)
        self._counts["evict_ssd"] += 1
        metrics.EVICTIONS.labels("ssd").inc()
        await self.ssd.delete(chunk.key)

    async def promote(self, chunk: Chunk, may_evict: VictimFilter | None) -> None:
        """Copies an SSD-only chunk into DRAM (verified); concurrent callers share one copy."""
        if chunk.blocks is not None:
            if chunk.layout is None:
                chunk.layout = decode_layout(self.dram.arena.read(chunk.extents or [], 0, chunk.size_bytes))
            return
        if chunk.promote_task is None:
            chunk.promote_task = asyncio.get_running_loop().create_task(self._copy_to_dram(chunk, may_evict))
        try:
            await asyncio.shield(chunk.promote_task)
        finally:
            if chunk.promote_task is not None and chunk.promote_task.done():
                chunk.promote_task = None

    async def _copy_to_dram(self, chunk: Chunk, may_evict: VictimFilter | None) -> None:
        chunk.readers += 1
        try:
            blocks = await self.allocate_dram(chunk.size_bytes, may_evict)
            if blocks is None:
                raise ResourceExhausted("DRAM is full of pinned or leased chunks; cannot load a chunk from SSD")
            try:
                data = await self.ssd.read(chunk.key)
                layout = decode_layout(data)
                # Never serve a chunk under a layout it was not written for (a file that
                # outlived its namespace and a re-registration of the name).
                self._namespaces.get(chunk.namespace).check_header(layout.header)
            except BaseException as exc:
                self.dram.free(blocks)
                if isinstance(exc, InvalidArgument):
                    await self.ssd.delete(chunk.key)
                elif not isinstance(exc, SsdChunkCorrupt | KeyError):
                    raise  # an I/O error says nothing about the chunk: keep it
                metrics.CORRUPT.inc()
                self.ssd_policy.on_remove(chunk.key)
                chunk.on_ssd = False
                chunk.deleted = True
                raise DataLoss(f"chunk {chunk.key.hex()} failed verification on SSD and was dropped") from exc
            extents = self.dram.extents(blocks, chunk.size_bytes)
            self.dram.arena.write(extents, 0, data)
            chunk.layout = chunk.layout or layout
            chunk.blocks, chunk.extents = blocks, extents
            self.dram_policy.on_insert(chunk.key)
            self._counts["promotion"] += 1
            metrics.PROMOTIONS.inc()
        finally:
            chunk.readers -= 1
            self.free_if_unread(chunk)

    async def promote_quietly(self, chunk: Chunk, may_evict: VictimFilter | None) -> None:
        """Background promotion: failures are logged, never raised to a caller."""
        try:
            await self.promote(chunk, may_evict)
        except (DataLoss, ResourceExhausted) as exc:
            log.info("promotion_skipped", key=chunk.key.hex(), reason=str(exc))

    def start_prefetches(self) -> int:
        """Lookahead only: promote SSD chunks the queue needs soon, evicting only chunks no
        hint protects (so a prefetch never pushes out something needed sooner)."""
        if self.settings.eviction_policy != "lookahead":
            return 0
        now = self._clock()

        def unprotected(victim: Chunk) -> bool:
            hint = self.hints.get(victim.key, now)
            return hint is None or hint.action is HintAction.EVICT_FIRST

        started = 0
        for key in self.hints.prefetch_keys(now):
            chunk = self._chunks.get(key)
            if chunk is not None and not chunk.deleted and chunk.tier is Tier.SSD and chunk.promote_task is None:
                self.spawn(self.promote_quietly(chunk, unprotected))
                started += 1
        return started

    async def enforce_watermarks(self) -> None:
        """Above a tier's high watermark, evicts down to its low watermark (headroom, so
        writes and promotions rarely wait for an eviction)."""
        s = self.settings
        await self._shrink(
            self.dram_policy, lambda: self.dram.used_bytes, self.dram.capacity_bytes,
            s.dram_high_watermark, s.dram_low_watermark, self._evict_from_dram,
        )
        await self._shrink(
            self.ssd_policy, lambda: self.ssd.used_bytes, self.ssd.capacity_bytes,
            s.ssd_high_watermark, s.ssd_low_watermark, self._evict_from_ssd,
        )

    async def _shrink(
        self,
        policy: EvictionPolicy,
        used_bytes: Callable[[], int],
        capacity_bytes: int,
        high: float,
        low: float,
        evict: Callable[[Chunk], Coroutine[Any, Any, None]],
    ) -> None:
        if used_bytes() <= high * capacity_bytes:
            return
        while used_bytes() > low * capacity_bytes:
            victim = self._next_victim(policy, None)
            if victim is None:
                return
            await evict(victim)
