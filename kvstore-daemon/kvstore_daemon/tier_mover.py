"""Moving chunks between the DRAM and SSD tiers: room-making with eviction, demotion,
write-through persistence, promotion, watermarks and look-ahead prefetch.

Both tiers are `Tier`s (tier.py): the mover copies bytes with `load`/`store` and drops
copies with `discard`; the upper tier (DRAM) holds the readable copy, the lower (SSD)
the persistent one. Eviction order comes from each tier's policy; a chunk with readers
or a live pin is never chosen. Evicting a DRAM chunk that has no SSD copy writes one
first (demotion); evicting an SSD chunk that has no DRAM copy removes it from the store,
unless a peer tier (the pool, peer_tier.py) takes a copy first: the chunk then stays in
the index, on its peer, and a read promotes it from there.
"""

from __future__ import annotations

import asyncio
import errno
import heapq
import itertools
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any

import structlog

from attnstore.chunks.format import Buffer, decode_layout
from attnstore.errors import DataLoss, InvalidArgument, ResourceExhausted
from kvstore_daemon import metrics
from kvstore_daemon.chunk_entry import Chunk, TierName
from kvstore_daemon.chunk_index import ChunkIndex
from kvstore_daemon.eviction import EvictionPolicy, make_tier_policies
from kvstore_daemon.hints import HintAction, HintBook
from kvstore_daemon.namespaces import NamespaceRegistry
from kvstore_daemon.predictive_policy import PredictivePolicy
from kvstore_daemon.settings import DaemonSettings
from kvstore_daemon.tier import Tier, TierCopyCorrupt, TierFull, TierWriteError

SKIP_LOG_INTERVAL_SECONDS = 10.0  # at most one promotions_skipped line per this (all counted in a metric)

log = structlog.get_logger("kvstore_daemon.tiers")

VictimFilter = Callable[[Chunk], bool]


class TierMover:
    def __init__(
        self,
        settings: DaemonSettings,
        dram: Tier,
        ssd: Tier,
        chunks: ChunkIndex,
        namespaces: NamespaceRegistry,
        hints: HintBook,
        clock: Callable[[], float],
        peer: Tier | None = None,
    ) -> None:
        self.settings = settings
        self.dram = dram
        self.ssd = ssd
        self.peer = peer
        self.hints = hints
        self.dram_policy, self.ssd_policy = make_tier_policies(
            settings.eviction_policy,
            hints,
            clock,
            settings.predictive_shadow_share,
            settings.predictive_ghost_keys_max,
            settings.predictive_named_keys_max,
            settings.predictive_shadow_switch_z,
        )
        self._chunks = chunks
        self._namespaces = namespaces
        self._clock = clock
        self._background: set[asyncio.Task[Any]] = set()
        self._persisting: set[asyncio.Task[bool]] = set()
        self._prefetched_for = -1  # the prediction generation whose soonest chunks were last promoted
        # Reserves and reads waiting for DRAM room: the predicted prefetch pauses for them.
        self._room_waiters = 0
        self._room_waiters_changed = asyncio.Condition()
        self._skip_logged_at = float("-inf")
        self._skips_unlogged = 0  # promotions skipped for want of DRAM room since the last log line

    async def finish_persists(self, timeout_seconds: float) -> None:
        if self._persisting:
            await asyncio.wait(list(self._persisting), timeout=timeout_seconds)

    def cancel_background(self) -> None:
        for task in list(self._background):
            task.cancel()

    def touch(self, chunk: Chunk) -> None:
        if chunk.borrower:  # read by its borrower: the last of the lender's borrowed chunks to go
            self._chunks.note_borrowed_read(chunk.key)
        hint = self.hints.get(chunk.key, now := self._clock())
        if hint is not None and hint.action is HintAction.PREDICT:
            metrics.NEXT_USE_ERROR.observe(now - hint.next_use_at)
        if chunk.blocks is not None:
            self.dram_policy.on_access(chunk.key)
        if chunk.on_ssd:
            self.ssd_policy.on_access(chunk.key)

    def looked_up(self, keys: Sequence[bytes], stored: int) -> None:
        """A lookup named `keys`, root first; the first `stored` were read as one chain."""
        if isinstance(self.dram_policy, PredictivePolicy):  # the tiers share what they learn
            self.dram_policy.on_chain(keys[:stored])
            self.dram_policy.on_miss(keys[stored:])

    def drop_deleted(self, chunk: Chunk) -> None:
        """Frees a chunk just marked deleted, or defers that to its last reader. A chunk read
        only by clients (leases, Gets, sends: all from its DRAM copy) leaves the index, the
        policies and its other tiers at once, so a put of its key is stored at once (a worker
        replacing a corrupt chunk while another still reads it); its DRAM copy stays for
        those readers. One that a tier copy still reads (a write to SSD or a peer, a
        promotion) stays indexed until that ends: the copy would publish it again."""
        if chunk.readers > chunk.client_readers or chunk.blocks is None or not self._chunks.holds(chunk):
            self.free_if_unread(chunk)
            return
        self._chunks.remove(chunk)
        self.dram_policy.on_remove(chunk.key)
        self._drop_lower_copies(chunk)
        self.free_if_unread(chunk)

    async def settle_deleted(self, chunk: Chunk) -> None:
        """Waits for the tier copies still reading a deleted chunk (its SSD write, its
        promotion), then drops it as its delete would have, so a put of its key is stored,
        not answered IN_PROGRESS (a copy to a peer has no task to wait for: that one is)."""
        for task in (chunk.persist_task, chunk.promote_task):
            if task is not None and not task.done():
                await asyncio.wait([task])
        self.drop_deleted(chunk)

    def free_if_unread(self, chunk: Chunk) -> None:
        """Completes a deferred delete once nobody reads the chunk."""
        if not chunk.deleted or chunk.readers > 0:
            return
        if not self._chunks.holds(chunk):  # left the index at its delete (drop_deleted), or freed already
            self.dram.discard(chunk)  # its policies may hold a newer chunk of its key: not touched
            return
        self._chunks.remove(chunk)
        self.drop_dram_copy(chunk)
        self._drop_lower_copies(chunk)

    def _drop_lower_copies(self, chunk: Chunk) -> None:
        if chunk.on_ssd:
            self.ssd_policy.on_remove(chunk.key)
            self.ssd.discard(chunk)
            chunk.on_ssd = False
        self._drop_peer_copy(chunk)

    def _drop_peer_copy(self, chunk: Chunk) -> None:
        if chunk.on_peer and self.peer is not None:
            self.peer.discard(chunk)
        chunk.on_peer = False

    def drop_dram_copy(self, chunk: Chunk) -> None:
        if chunk.blocks is not None:
            self.dram_policy.on_remove(chunk.key)
            self.dram.discard(chunk)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def make_dram_room(self, size_bytes: int, may_evict: VictimFilter | None) -> bool:
        """Evicts (and demotes) as the policy orders until `size_bytes` fit in DRAM; False if
        only unevictable chunks remain. Chunks whose SSD copy is being written cannot be
        evicted until it lands, so those writes are waited for rather than given up on. A
        caller without a filter (a reserve, a read) is counted while it waits: the predicted
        prefetch gives way to it."""
        if self.dram.has_room(size_bytes):
            return True
        foreground = may_evict is None
        if foreground:
            self._room_waiters += 1
        try:
            while not self.dram.has_room(size_bytes):
                victim = self._next_victim(self.dram_policy, may_evict)
                if victim is not None:
                    await self._evict_from_dram(victim)
                elif self._persisting:
                    await asyncio.wait(list(self._persisting), return_when=asyncio.FIRST_COMPLETED)
                else:
                    return False
            return True
        finally:
            if foreground:
                self._room_waiters -= 1
                if not self._room_waiters:
                    async with self._room_waiters_changed:
                        self._room_waiters_changed.notify_all()

    def _next_victim(
        self, policy: EvictionPolicy, may_evict: VictimFilter | None, borrowed_first: bool = False
    ) -> Chunk | None:
        """`borrowed_first`: chunks held for pool borrowers go first, the oldest placement
        first (this node's own KV has the first claim on its room), then the policy's order.
        Only the SSD tier asks it, where a chunk leaves the node: borrowed chunks are put
        durable, so they nearly all sit there and the walk stops at the first of them. One
        still in DRAM is skipped (dropping its SSD copy frees nothing of the node's; its
        demotion would write it back)."""
        borrowed = self._borrowed_on(policy) if borrowed_first else ()
        return self._first_evictable(itertools.chain(borrowed, policy.victims()), may_evict)

    def _borrowed_on(self, policy: EvictionPolicy) -> Iterator[bytes]:
        """Keys held for pool borrowers in `policy`'s tier and no other, least recently
        placed or read first."""
        return (
            key for key in self._chunks.borrowed_keys() if key in policy and self._chunks[key].blocks is None
        )

    def _first_evictable(self, keys: Iterable[bytes], may_evict: VictimFilter | None) -> Chunk | None:
        now = self._clock()
        for key in keys:
            chunk = self._chunks[key]
            if chunk.readers == 0 and chunk.pinned_until <= now and (may_evict is None or may_evict(chunk)):
                return chunk
        return None

    async def evict_borrowed(self) -> bool:
        """Evicts the SSD chunk held for a pool borrower that goes first (its borrower is
        told through the ledger), making room for a newer one; False if none can go."""
        victim = self._first_evictable(self._borrowed_on(self.ssd_policy), None)
        if victim is None:
            return False
        await self._evict_from_ssd(victim)
        return True

    async def _evict_from_dram(self, chunk: Chunk) -> None:
        predictive = self.dram_policy if isinstance(self.dram_policy, PredictivePolicy) else None
        if predictive is not None:
            predictive.set_aside(chunk.key)  # out of the walk while its SSD copy is written
        try:
            await self._leave_dram(chunk)
        finally:
            if predictive is not None:  # it stayed: read meanwhile, or the eviction was cancelled
                predictive.kept(chunk.key)

    async def _leave_dram(self, chunk: Chunk) -> None:
        if self.settings.pool_place_dram_evictions and not chunk.on_ssd:
            await self._place_on_peer(chunk)  # before the SSD: a peer's DRAM is the nearer tier
        if not chunk.on_ssd and not chunk.on_peer:  # a peer's copy is its lower tier already
            chunk.readers += 1  # holds the blocks while their bytes are written out
            try:
                demoted = await self.persisted(chunk)
            finally:
                chunk.readers -= 1
            if demoted:
                metrics.DEMOTIONS.inc()
        if chunk.readers > 0 or chunk.blocks is None or not self._chunks.holds(chunk):
            self.free_if_unread(chunk)
            return
        self.drop_dram_copy(chunk)
        metrics.EVICTIONS.labels(TierName.DRAM.value).inc()
        self._count_reason(chunk, TierName.DRAM)
        if not chunk.on_ssd and not chunk.on_peer:  # SSD refused it: the chunk is gone
            log.info("dram_eviction_dropped", key=chunk.key.hex(), reason="no SSD copy could be written")
            self._chunks.remove(chunk)

    async def demote(self, chunk: Chunk) -> None:
        """Moves a chunk to SSD now (a declined write, declined_admission=ssd_only); its
        DRAM copy stays while someone reads it, as on any eviction."""
        if chunk.blocks is not None and self._chunks.holds(chunk):
            await self._evict_from_dram(chunk)

    def start_persist(self, chunk: Chunk) -> asyncio.Task[bool]:
        task = chunk.persist_task
        # A finished write counts while its copy lasts: the SSD may have evicted the copy since,
        # the chunk staying in DRAM, and its DRAM eviction must then write it again, not drop it.
        if task is None or (
            task.done() and (task.cancelled() or task.exception() is not None or not chunk.on_ssd)
        ):
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
            if chunk.blocks is None:
                return False
            data = await self.dram.load(chunk)
            for attempt in range(2):
                if not await self._make_ssd_room(chunk.size_bytes):
                    return False
                try:
                    await self.ssd.store(chunk, data)
                    break
                except TierWriteError as exc:
                    metrics.SSD_WRITE_ERRORS.inc()
                    # A full disk (the capacity was more than it holds, or another program
                    # took the space) is pressure: shrink to what it holds, evict, retry once.
                    if exc.errno != errno.ENOSPC or attempt:
                        log.warning("ssd_write_failed", key=chunk.key.hex(), error=str(exc))
                        return False
                    self.ssd.recheck_room()
                    log.info(
                        "ssd_full",
                        key=chunk.key.hex(),
                        error=str(exc),
                        capacity_bytes=self.ssd.capacity_bytes,
                    )
        except TierFull as exc:
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
        rechecked = False
        while not self.ssd.has_room(size_bytes):
            victim = self._next_victim(self.ssd_policy, None, borrowed_first=True)
            if victim is not None:
                await self._evict_from_ssd(victim)
            elif rechecked:
                return False
            else:
                self.ssd.recheck_room()
                rechecked = True
        return True

    async def _evict_from_ssd(self, chunk: Chunk) -> None:
        if chunk.blocks is None:
            await self._place_on_peer(chunk)
            if chunk.readers > 0:  # read while it was shipped (or refused): it keeps its SSD copy this round,
                return  # else a promotion from the file would land a chunk the index no longer holds
        self.ssd_policy.on_remove(chunk.key)
        chunk.on_ssd = False
        if chunk.blocks is None and not chunk.on_peer:  # no other copy: the chunk leaves the store
            self._chunks.remove(chunk)
        metrics.EVICTIONS.labels(TierName.SSD.value).inc()
        self._count_reason(chunk, TierName.SSD)
        unlinking = self.ssd.discard(chunk)
        if unlinking is not None:  # the space is back only once the file is gone
            await asyncio.shield(unlinking)

    async def _place_on_peer(self, chunk: Chunk) -> bool:
        """Copies a chunk leaving DRAM or SSD to a peer that accepts (from DRAM when it is
        there); True if a peer holds it. A chunk this daemon holds for a borrower is not
        lent on: its borrower counts it here."""
        if self.peer is None or chunk.on_peer or chunk.borrower:
            return chunk.on_peer
        if not self.peer.has_room(chunk.size_bytes):
            return False
        chunk.readers += 1  # not chosen again, not freed, while its bytes travel
        try:
            await self.peer.store(
                chunk, await (self.dram.load(chunk) if chunk.blocks is not None else self.ssd.load(chunk))
            )
        except (TierFull, TierCopyCorrupt, TierWriteError, KeyError) as exc:
            log.info("peer_placement_failed", key=chunk.key.hex(), reason=str(exc))
            return False
        finally:
            chunk.readers -= 1
        chunk.on_peer = True
        metrics.PEER_PLACEMENTS.inc()
        return True

    async def promote(self, chunk: Chunk, may_evict: VictimFilter | None) -> None:
        """Copies an SSD-only chunk into DRAM (verified); concurrent callers share one copy."""
        if chunk.blocks is not None:
            if chunk.layout is None:
                chunk.layout = decode_layout(await self.dram.load(chunk))
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
            if not await self.make_dram_room(chunk.size_bytes, may_evict):
                raise ResourceExhausted(_no_dram_room(may_evict))
            from_peer = chunk.on_peer and not chunk.on_ssd
            try:
                data = await (self._load_from_peer(chunk) if from_peer else self.ssd.load(chunk))
                layout = decode_layout(data)
                # Never serve a chunk under a layout it was not written for (a file that
                # outlived its namespace and a re-registration of the name).
                self._namespaces.get(chunk.namespace).check_header(layout.header)
            except (TierCopyCorrupt, KeyError, InvalidArgument) as exc:
                if isinstance(exc, InvalidArgument) and chunk.on_ssd:
                    self.ssd.discard(chunk)
                metrics.CORRUPT.inc()
                self.ssd_policy.on_remove(chunk.key)
                chunk.on_ssd = False
                chunk.deleted = True
                where = "its peer" if from_peer else "SSD"
                raise DataLoss(
                    f"chunk {chunk.key.hex()} failed verification on {where} and was dropped"
                ) from exc
            if not await self.make_dram_room(chunk.size_bytes, may_evict):  # others took it meanwhile
                raise ResourceExhausted(_no_dram_room(may_evict))
            await self.dram.store(chunk, data)
            chunk.layout = chunk.layout or layout
            self.dram_policy.on_insert(chunk.key)
            metrics.PROMOTIONS.inc()
        finally:
            chunk.readers -= 1
            self.free_if_unread(chunk)

    async def _load_from_peer(self, chunk: Chunk) -> Buffer:
        """The peer's copy (checksums verified by the peer's client). A peer that lost it or
        died raises TierCopyCorrupt: the caller drops the chunk, a miss."""
        assert self.peer is not None
        try:
            return await self.peer.load(chunk)
        except (TierCopyCorrupt, KeyError):
            chunk.on_peer = False
            raise

    async def promote_quietly(self, chunk: Chunk, may_evict: VictimFilter | None) -> None:
        """Background promotion: failures are logged, never raised to a caller."""
        try:
            await self.promote(chunk, may_evict)
        except DataLoss as exc:
            log.info("promotion_skipped", key=chunk.key.hex(), reason=str(exc))
        except ResourceExhausted as exc:
            # Counted, logged at most every SKIP_LOG_INTERVAL_SECONDS: a 10-minute replay's
            # prefetches found no victim thousands of times (each a line before).
            reason = "prefetch_no_victim" if may_evict is not None else "no_evictable_chunk"
            metrics.PROMOTIONS_SKIPPED.labels(reason).inc()
            self._skips_unlogged += 1
            now = self._clock()
            if now >= self._skip_logged_at + SKIP_LOG_INTERVAL_SECONDS:
                log.info(
                    "promotions_skipped",
                    count=self._skips_unlogged,
                    last_key=chunk.key.hex(),
                    reason=str(exc),
                )
                self._skip_logged_at, self._skips_unlogged = now, 0

    def _count_reason(self, chunk: Chunk, tier: TierName) -> None:
        """Evictions by the victim's hint: unhinted, evict_first, decline, predict..."""
        hint = self.hints.get(chunk.key, self._clock())
        metrics.EVICTION_REASONS.labels(tier.value, "unhinted" if hint is None else hint.action.value).inc()

    def start_prefetches(self) -> int:
        """Lookahead and predictive only: move SSD chunks the queue needs soon up to DRAM
        (_move_to_dram), evicting only chunks no hint protects (so a prefetch never pushes
        out something needed sooner)."""
        if self.settings.eviction_policy not in ("lookahead", "predictive"):
            return 0
        now = self._clock()

        def unprotected(victim: Chunk) -> bool:
            """Not needed by a queued job: a prediction (minutes away, as a rule) may make
            way for a chunk the queue needs now; the policy offers the furthest first."""
            hint = self.hints.get(victim.key, now)
            return hint is None or hint.action.gives_up or hint.action is HintAction.PREDICT

        started = 0
        for key in self.hints.prefetch_keys(now):
            chunk = self._chunks.get(key)
            if chunk is not None and _promotable(chunk):
                self.spawn(self._move_to_dram(chunk, unprotected))
                started += 1
        if self.settings.eviction_policy == "predictive":
            started += self._prefetch_predicted(now)
        return started

    def _prefetch_predicted(self, now: float) -> int:
        """Predictive: when predictions arrive, the soonest-predicted chunks that live only
        on SSD move to DRAM ahead of their turn (up to `predictive_prefetch_dram_share` of it),
        each evicting only chunks predicted later, so DRAM converges on what comes next. One
        at a time, in one task, pausing while a reserve or read waits for DRAM room: spawned
        all at once, 2,900-3,800 promotions per 15 s of a Mooncake replay at 5% / 50% held
        a turn's reserve up to 1.1 s in process, past its 10 s deadline on a loaded daemon."""
        share = self.settings.predictive_prefetch_dram_share
        if not share or self.hints.prediction_generation == self._prefetched_for:
            return 0
        generation = self._prefetched_for = self.hints.prediction_generation
        soonest = heapq.nsmallest(
            self.dram.capacity_bytes // max(self.settings.dram_block_bytes, 1),
            (
                (hint.next_use_at, hint.depth, key)
                for key, hint in self.hints.items()
                if hint.action is HintAction.PREDICT and hint.expires_at > now
            ),
        )
        budget, moves = self.dram.capacity_bytes * share, []
        for next_use_at, _, key in soonest:
            chunk = self._chunks.get(key)
            if chunk is None or chunk.deleted:
                continue
            budget -= chunk.size_bytes
            if budget < 0:
                break
            if _promotable(chunk):
                moves.append((chunk, self._needed_after(next_use_at, now)))
        if moves:
            self.spawn(self._move_in_turn(generation, moves))
        return len(moves)

    async def _move_in_turn(self, generation: int, moves: list[tuple[Chunk, VictimFilter]]) -> None:
        """The predicted moves one by one, each after every waiting reserve or read got its
        room; newer predictions end the walk (their own takes over)."""
        for chunk, may_evict in moves:
            # Woken, it checks again: a reserve's next key may wait by then.
            async with self._room_waiters_changed:
                await self._room_waiters_changed.wait_for(lambda: not self._room_waiters)
            if generation != self._prefetched_for:
                return
            if _promotable(chunk):  # again: it may have moved, gone or been promoted while this waited
                await self._move_to_dram(chunk, may_evict)

    async def _move_to_dram(self, chunk: Chunk, may_evict: VictimFilter) -> None:
        """A prefetch (the queue's or a prediction's) as a move where the store keeps no SSD
        copy of what DRAM holds (persist_on_commit off): a copy on both tiers is a chunk's
        room less in the store. In a model of the daemon, Mooncake's 10 minutes at 1% / 10%,
        the predicted prefetch closed 6.1% of the gap with the copies kept, 9.6% as moves; on
        the real daemon at 5% / 50%, where the queue's prefetch serves 97% of the hits, its
        copies cost 1,246 more chunks dropped from SSD than moves (docs/benchmarks.md).
        DRAM's eviction writes it back (start_persist). The copy stays while anyone reads or
        writes it, or a borrower counts on it."""
        await self.promote_quietly(chunk, may_evict)
        if (
            self.settings.persist_on_commit
            or chunk.blocks is None
            or not chunk.on_ssd
            or chunk.readers
            or chunk.deleted
            or chunk.borrower
            or not self._chunks.holds(chunk)
            or (chunk.persist_task is not None and not chunk.persist_task.done())
            or (chunk.promote_task is not None and not chunk.promote_task.done())
        ):
            return
        self.ssd_policy.on_remove(chunk.key)
        chunk.on_ssd = False
        metrics.PREFETCH_MOVES.inc()
        unlinking = self.ssd.discard(chunk)
        if unlinking is not None:
            await asyncio.shield(unlinking)

    def _needed_after(self, next_use_at: float, now: float) -> VictimFilter:
        def later(victim: Chunk) -> bool:
            hint = self.hints.get(victim.key, now)
            return (
                hint is None
                or hint.action.gives_up
                or (hint.action is HintAction.PREDICT and hint.next_use_at > next_use_at)
            )

        return later

    async def enforce_watermarks(self) -> None:
        """Above a tier's high watermark, evicts down to its low watermark (headroom, so
        writes and promotions rarely wait for an eviction)."""
        s = self.settings
        await self._shrink(
            self.dram, self.dram_policy, s.dram_high_watermark, s.dram_low_watermark, self._evict_from_dram
        )
        await self._shrink(
            self.ssd, self.ssd_policy, s.ssd_high_watermark, s.ssd_low_watermark, self._evict_from_ssd
        )

    async def _shrink(
        self,
        tier: Tier,
        policy: EvictionPolicy,
        high: float,
        low: float,
        evict: Callable[[Chunk], Coroutine[Any, Any, None]],
    ) -> None:
        if tier.used_bytes <= high * tier.capacity_bytes:
            return
        while tier.used_bytes > low * tier.capacity_bytes:
            victim = self._next_victim(policy, None, borrowed_first=tier is self.ssd)
            if victim is None:
                return
            await evict(victim)


def _promotable(chunk: Chunk) -> bool:
    """Lives only on SSD, not deleted, no promotion running: a prefetch may move it."""
    return not chunk.deleted and chunk.tier is TierName.SSD and chunk.promote_task is None


def _no_dram_room(may_evict: VictimFilter | None) -> str:
    if may_evict is None:
        return "DRAM is full of pinned or leased chunks; cannot load a chunk from SSD"
    return (
        "no DRAM chunk may make way for this prefetch: every resident one is pinned, leased, being read or "
        "predicted sooner"
    )
