"""The chunk index and the lifecycle of every chunk across the DRAM and SSD tiers.

    ReservePut ─> RESERVED (blocks held, invisible) ─CommitPut─> COMMITTED in DRAM
        │ AbortPut / TTL                                  │ persist (background, or durable commit)
        v                                                 v
      freed                                     COMMITTED in DRAM + SSD
                                                          │ DRAM eviction (demotes first when
                                                          v  the chunk has no SSD copy yet)
      promote (Get, GetShm, Pin, Lookup(promote),  COMMITTED on SSD only ─SSD eviction / Delete─> gone
      prefetch hint) ─> back to DRAM + SSD

A chunk with readers (a lease, a promotion, a persist in flight) is never evicted
or freed; deleting it hides it at once and frees it when the last reader leaves.
Pins keep a chunk in DRAM. Reservations, leases, pins and hints all expire, so a
dead client cannot hold memory forever. All state lives on the event loop thread;
only file I/O runs in the SSD tier's threads.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog

from attnstore.chunks.format import (
    ChunkCorruptError,
    ChunkFormatError,
    ChunkLayout,
    decode_layout,
    verify_layers,
)
from attnstore.errors import InvalidArgument, NotFound, OutOfRange, Unavailable
from attnstore.shm_arena import Extent, seqlock_reads_supported
from attnstore.token_buckets import TokenBuckets
from kvstore_daemon import metrics
from kvstore_daemon.chunk_entry import (
    Chunk,
    Lease,
    Reservation,
    ReserveResult,
    ReserveStatus,
    StoreStats,
    TierName,
)
from kvstore_daemon.chunk_index import ChunkIndex
from kvstore_daemon.dram_tier import DramTier
from kvstore_daemon.hints import HintAction, HintBook, HintSpec
from kvstore_daemon.namespaces import (
    NamespaceLayout,
    NamespaceRegistry,
    NamespaceTableFull,
    RegistrationRateLimited,
)
from kvstore_daemon.peer_tier import PeerTier
from kvstore_daemon.settings import DaemonSettings
from kvstore_daemon.ssd_tier import SsdTier
from kvstore_daemon.tier_mover import TierMover

log = structlog.get_logger("kvstore_daemon.store")


@dataclass(frozen=True)
class UnheldCopy:
    """Where a DRAM chunk's bytes lay when a data-plane thread looked, without a reader on
    it: bytes copied from `extents` are the chunk's if its blocks still have `versions`
    after the copy (`ChunkStore.unheld_copies_valid`)."""

    layout: ChunkLayout
    extents: list[Extent]
    blocks: tuple[int, ...]
    versions: tuple[int, ...]


class ChunkStore:
    def __init__(
        self,
        settings: DaemonSettings,
        dram: DramTier,
        ssd: SsdTier,
        namespaces: NamespaceRegistry,
        clock: Callable[[], float] = time.monotonic,
        peer: PeerTier | None = None,
    ) -> None:
        self.settings = settings
        self.dram = dram
        self.ssd = ssd
        self.namespaces = namespaces
        self._clock = clock
        self._chunks = ChunkIndex()
        self._reservations: dict[int, Reservation] = {}
        self._reserved_keys: set[bytes] = set()
        self._leases: dict[int, Lease] = {}
        self.hints = HintBook()
        self._admission = (
            settings.eviction_policy == "predictive"
        )  # DECLINE hints refuse writes (or send them to SSD)
        self._ssd_only: set[bytes] = set()  # keys reserved while declined: demoted once committed
        # Ids start at a random point so ids a client kept from before a restart name nothing.
        self._ids = itertools.count(secrets.randbits(48) + 1)
        # New namespaces per caller: a worker's burst at start passes, a loop registering
        # namespaces cannot fill the table in a second (issue 26: 1,022 took about one).
        self._registrations = TokenBuckets(
            settings.namespace_registrations_per_second, settings.namespace_registration_burst, clock
        )
        self._peer = peer
        self._lending = settings.lending_limits
        self._mover = TierMover(settings, dram, ssd, self._chunks, namespaces, self.hints, clock, peer)

    # ---- start and stop ----------------------------------------------------------

    async def start(self) -> None:
        """Rebuilds the index from the SSD tier. Chunks of a namespace the namespace file
        does not name (reclaimed, or its registration never saved) are deleted: a later
        registration of that name may declare another layout."""
        orphans = 0
        for stored in await self.ssd.open():
            if stored.namespace not in self.namespaces:
                await self.ssd.delete(stored.key)
                orphans += 1
                continue
            self._chunks.add(
                Chunk(stored.key, stored.namespace, stored.size_bytes, on_ssd=True, borrower=stored.borrower)
            )
            self._mover.ssd_policy.on_insert(stored.key)
        on_peers = self._restore_placements()
        log.info(
            "recovered", chunks=len(self._chunks), on_peers=on_peers, dropped=self.ssd.recovery_dropped,
            unregistered=orphans,
        )  # fmt: skip
        metrics.CORRUPT.inc(self.ssd.recovery_dropped)  # bad files found at start count like bad reads
        metrics.NAMESPACES.set(len(self.namespaces))
        self._update_gauges()

    def _restore_placements(self) -> int:
        """Indexes again the chunks an earlier life placed on peers; how many."""
        if self._peer is None:
            return 0
        restored = 0
        for placement in self._peer.restore():
            chunk = self._chunks.get(placement.key)
            if chunk is None and placement.namespace in self.namespaces:
                chunk = Chunk(placement.key, placement.namespace, placement.size_bytes)
                self._chunks.add(chunk)
            if chunk is None:  # its namespace was reclaimed: the peer's copy names nothing now
                self._peer.discard(Chunk(placement.key, placement.namespace, placement.size_bytes))
                continue
            chunk.on_peer = True
            restored += 1
        return restored

    async def stop(self, grace_seconds: float) -> None:
        """Lets in-flight SSD writes finish (bounded by the grace period), then closes the tiers."""
        await self._mover.finish_persists(grace_seconds)
        self._mover.cancel_background()
        await self.ssd.close()
        self.dram.close()

    # ---- namespaces and lookups -----------------------------------------------------

    def register_namespace(self, namespace: bytes, layout: NamespaceLayout, caller: str) -> int:
        """Registers (idempotently); a new namespace costs `caller` one of its rate and may
        reclaim an idle, empty one. Refusals are counted by reason."""
        try:
            if namespace not in self.namespaces and (wait_seconds := self._registrations.take(caller)):
                raise RegistrationRateLimited(
                    f"{caller} registers new namespaces faster than {self._registrations.rate_per_second:g}/s "
                    f"(namespace_registrations_per_second, burst {self._registrations.burst}); "
                    f"retry in {wait_seconds:.2f}s"
                )
            return self.namespaces.register(namespace, layout, self._holds_anything)
        except RegistrationRateLimited:
            metrics.NAMESPACE_REFUSALS.labels("rate_limited").inc()
            raise
        except NamespaceTableFull:
            metrics.NAMESPACE_REFUSALS.labels("table_full").inc()
            raise
        finally:
            metrics.NAMESPACES.set(len(self.namespaces))

    def _holds_anything(self, namespace: bytes) -> bool:
        """Whether a namespace has a chunk (in any tier or being read) or a write open."""
        return self._chunks.holds_namespace(namespace) or any(
            r.namespace == namespace for r in self._reservations.values()
        )

    def lookup(self, namespace: bytes, keys: Sequence[bytes], promote: bool) -> list[TierName]:
        """Tiers of the longest stored prefix of `keys`."""
        self.namespaces.get(namespace)
        tiers: list[TierName] = []
        for key in keys:
            chunk = self._visible(namespace, key)
            if chunk is None:
                break
            tiers.append(chunk.tier)
            self._mover.touch(chunk)
            if promote and chunk.tier is TierName.SSD:
                self._mover.spawn(self._mover.promote_quietly(chunk, None))
        self._mover.looked_up(keys, len(tiers))
        self._count_hits(tiers, misses=len(keys) - len(tiers))
        return tiers

    def placed_on(self, key: bytes) -> str:
        """The gRPC address of the peer holding a TIER_PEER chunk (for Lookup: readers may
        fetch it there themselves); empty when no peer does."""
        return (self._peer.placed_on(key) if self._peer is not None else None) or ""

    # ---- two-phase writes ---------------------------------------------------------

    async def reserve(
        self, namespace: bytes, items: Sequence[tuple[bytes, int]], ttl_seconds: float, borrower: str = ""
    ) -> list[ReserveResult]:
        """`borrower`: a pool peer placing its evictions here (its node); they are counted
        as lent and must fit the lending limits (`_may_lend`), else NO_SPACE."""
        layout = self.namespaces.get(namespace)
        limit = min(layout.max_chunk_bytes, self.settings.max_chunk_bytes)
        for key, size in items:
            if not 0 < size <= limit:
                raise InvalidArgument(
                    f"chunk {key.hex()} of {size} bytes is outside 1..{limit} bytes for this namespace"
                )
        results = []
        for key, size in items:
            deleted = self._chunks.get(key)
            if deleted is not None and deleted.deleted:  # still indexed for a tier copy of it
                await self._mover.settle_deleted(deleted)
            status = self._reserved_status(namespace, key)
            if status is None and borrower:
                if await self._make_lending_room(size):
                    status = self._reserved_status(namespace, key)  # another reserve may have come meanwhile
                else:
                    metrics.LENDING_REFUSED.inc()
                    status = ReserveStatus.NO_SPACE
            if status is not None:
                results.append(ReserveResult(key, status))
                continue
            if self._admission and self.hints.declines(key, self._clock()):  # the scheduler expects no reader
                metrics.ADMISSIONS_DECLINED.inc()
                if self.settings.declined_admission == "refuse":
                    results.append(ReserveResult(key, ReserveStatus.NO_SPACE))
                    continue
                self._ssd_only.add(key)
            self._reserved_keys.add(key)  # before awaiting, so a concurrent reserve sees it
            if not await self._mover.make_dram_room(size, None):
                self._reserved_keys.discard(key)
                self._ssd_only.discard(key)
                results.append(ReserveResult(key, ReserveStatus.NO_SPACE))
                continue
            blocks = self.dram.allocate(size)  # nothing ran since the room was made: it is still free
            extents = self.dram.extents(blocks, size)
            write_id = next(self._ids)
            self._reservations[write_id] = Reservation(
                write_id,
                key,
                namespace,
                size,
                blocks,
                extents,
                self._clock() + ttl_seconds,
                borrower=borrower,
            )
            results.append(ReserveResult(key, ReserveStatus.RESERVED, write_id, tuple(extents)))
        self._update_gauges()
        return results

    def _reserved_status(self, namespace: bytes, key: bytes) -> ReserveStatus | None:
        """ALREADY_STORED or IN_PROGRESS when `key` cannot be reserved now, else None."""
        if self._visible(namespace, key) is not None:
            return ReserveStatus.ALREADY_STORED
        if key in self._reserved_keys or key in self._chunks:
            return ReserveStatus.IN_PROGRESS
        return None

    def write(self, write_id: int, offset: int, data: bytes | memoryview) -> None:
        reservation = self._reservation(write_id)
        if offset + len(data) > reservation.size_bytes:
            raise OutOfRange(
                f"write of {len(data)} bytes at offset {offset} runs past the {reservation.size_bytes}-byte "
                f"reservation {write_id}"
            )
        self.dram.arena.write(reservation.extents, offset, data)
        reservation.streamed_bytes += len(data)

    async def commit(self, write_ids: Sequence[int], durable: bool) -> int:
        """Validates every written chunk first (all or nothing), then makes them visible."""
        reservations = [self._reservation(write_id) for write_id in write_ids]
        layouts = [self._check_written(r) for r in reservations]
        committed: list[Chunk] = []
        for reservation, layout in zip(reservations, layouts, strict=True):
            del self._reservations[reservation.write_id]
            self._reserved_keys.discard(reservation.key)
            chunk = Chunk(
                reservation.key,
                reservation.namespace,
                reservation.size_bytes,
                layout,
                reservation.blocks,
                reservation.extents,
                borrower=reservation.borrower,
            )
            self._chunks.add(chunk)
            self.dram.arrived(chunk)
            self._mover.dram_policy.on_insert(chunk.key)
            metrics.BYTES_IN.labels("shm").inc(max(0, chunk.size_bytes - reservation.streamed_bytes))
            # A borrowed chunk goes to SSD and leaves DRAM, as a declined one: it is put durable,
            # so a DRAM copy would take the lender's DRAM from its own node's chunks twice over
            # (bench-pool's replay: lenders' DRAM went to copies of what their SSD held).
            if reservation.key in self._ssd_only or reservation.borrower:
                self._ssd_only.discard(reservation.key)
                self._mover.spawn(self._mover.demote(chunk))
            elif self.settings.persist_on_commit or durable:
                self._mover.start_persist(chunk)
            committed.append(chunk)
        self._update_gauges()
        if durable:
            outcomes = await asyncio.gather(*(self._mover.persisted(chunk) for chunk in committed))
            if not all(outcomes):
                raise Unavailable(
                    "chunks are committed in DRAM but the SSD tier could not store them durably"
                )
        return len(committed)

    def abort(self, write_ids: Sequence[int]) -> int:
        aborted = 0
        for write_id in write_ids:
            reservation = self._reservations.pop(write_id, None)
            if reservation is not None:
                self._drop_reservation(reservation)
                aborted += 1
        self._update_gauges()
        return aborted

    # ---- reads ------------------------------------------------------------------

    @asynccontextmanager
    async def reading(self, namespace: bytes, keys: Sequence[bytes]) -> AsyncIterator[list[Chunk]]:
        """Holds `keys` in DRAM for the duration of a streamed read."""
        chunks = await self._acquire(namespace, keys)
        try:
            yield chunks
        finally:
            self._release(chunks)

    async def lease(self, namespace: bytes, keys: Sequence[bytes], ttl_seconds: float) -> Lease:
        """Holds `keys` in DRAM for a shared-memory reader until released or expired."""
        chunks = await self._acquire(namespace, keys)
        lease = Lease(next(self._ids), chunks, self._clock() + ttl_seconds)
        self._leases[lease.lease_id] = lease
        return lease

    def release_lease(self, lease_id: int) -> bool:
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return False
        self._release(lease.chunks)
        return True

    async def hold_keys(self, namespace: bytes, keys: Sequence[bytes]) -> list[Chunk]:
        """Takes a reader on each chunk, DRAM-resident, for a data-plane send; `unhold` ends it."""
        return await self._acquire(namespace, keys)

    def hold_leased(self, namespace: bytes, lease_id: int, indices: Sequence[int]) -> list[Chunk]:
        """Takes a reader on chunks `indices` of a lease, for a data-plane send that must
        outlive the lease's TTL; `unhold` gives them back. A lease of another namespace is
        as unknown as a missing one (a tenant learns nothing of another's ids)."""
        lease = self._leases.get(lease_id)
        if lease is None or any(chunk.namespace != namespace for chunk in lease.chunks):
            raise NotFound(f"lease {lease_id} is unknown: never granted, released or expired")
        if not all(0 <= index < len(lease.chunks) for index in indices):
            raise InvalidArgument(
                f"chunk indices must lie in 0..{len(lease.chunks) - 1} for lease {lease_id}"
            )
        chunks = [lease.chunks[index] for index in indices]
        for chunk in chunks:
            chunk.readers += 1
            chunk.client_readers += 1
        return chunks

    def unhold(self, chunks: Sequence[Chunk], release_lease_id: int | None) -> None:
        self._release(chunks)
        if release_lease_id is not None:
            self.release_lease(release_lease_id)

    def check_streamed_writes(self, namespace: bytes, writes: Sequence[tuple[int, int]]) -> None:
        """Each (write id, bytes) names a reservation of `namespace` and its whole size."""
        for write_id, size in writes:
            reservation = self._reservations.get(write_id)
            if reservation is None or reservation.namespace != namespace:
                raise NotFound(
                    f"write id {write_id} is unknown: never reserved, already committed or aborted, or expired"
                )
            if size != reservation.size_bytes:
                raise InvalidArgument(
                    f"write id {write_id} reserved {reservation.size_bytes} bytes, not {size}"
                )

    def note_lease_free_reads(
        self, namespace: bytes, keys: Sequence[bytes], bytes_transport: str | None = "shm"
    ) -> None:
        """Chunks copied from the arena without a lease (version-checked: a worker's copy,
        or a data-plane thread's unheld send): hits and recency as for a leased read, and
        their bytes out under `bytes_transport` (None: the caller counted them). Chunks
        gone meanwhile are ignored."""
        self.namespaces.get(namespace)
        chunks = [
            c
            for c in (self._visible(namespace, key) for key in keys)
            if c is not None and c.blocks is not None
        ]
        self._count_hits([chunk.tier for chunk in chunks], misses=0)
        for chunk in chunks:
            self._mover.touch(chunk)
        if bytes_transport is not None:
            metrics.BYTES_OUT.labels(bytes_transport).inc(sum(chunk.size_bytes for chunk in chunks))

    def unheld_copies(self, namespace: bytes, keys: Sequence[bytes]) -> list[UnheldCopy] | None:
        """From a data-plane thread, off the event loop: where each chunk lies in DRAM, with
        its blocks' versions; None unless every one is visible, parsed and in DRAM (the
        caller then holds them on the loop, which promotes or says NotFound). Dict and
        attribute reads only: the GIL makes each atomic, and the DRAM tier's discard lock
        makes a chunk's blocks and versions agree."""
        if not seqlock_reads_supported():
            return None
        copies = []
        for key in keys:
            chunk = self._visible(namespace, key)
            copy = self.unheld_copy(chunk) if chunk is not None else None
            if copy is None:
                return None
            copies.append(copy)
        return copies

    def unheld_copy(self, chunk: Chunk) -> UnheldCopy | None:
        """Where `chunk` lies in DRAM with its blocks' versions; None unless parsed and there."""
        if chunk.layout is None:
            return None
        placed = self.dram.versioned_extents(chunk)
        return None if placed is None else UnheldCopy(chunk.layout, *placed)

    def unheld_copies_valid(self, copies: Sequence[UnheldCopy]) -> bool:
        """No chunk of `copies` has left its blocks since they were taken (any thread)."""
        return all(self.dram.unchanged(copy.blocks, copy.versions) for copy in copies)

    def layer_views(self, chunk: Chunk | UnheldCopy, layer_start: int, layer_end: int) -> list[memoryview]:
        """Zero-copy views of layers [layer_start, layer_end) of a chunk held by a reader
        (or of an unheld copy, checked after use)."""
        assert chunk.layout is not None and chunk.extents is not None  # guaranteed by _acquire
        start, end = chunk.layout.layer_span(layer_start, layer_end)
        return self.dram.arena.views(chunk.extents, start, end)

    def header_bytes(self, chunk: Chunk | UnheldCopy) -> bytes:
        assert chunk.layout is not None and chunk.extents is not None
        return bytes(self.dram.arena.read(chunk.extents, 0, chunk.layout.data_offset))

    # ---- delete, pin, hint --------------------------------------------------------

    def delete(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        self.namespaces.get(namespace)
        deleted = 0
        for key in keys:
            chunk = self._visible(namespace, key)
            if chunk is not None:
                chunk.deleted = True
                if chunk.blocks is not None:  # readers may hold it a while: stop lease-free reads now
                    self.dram.invalidate(chunk.blocks)
                self.hints.forget([key])
                self._mover.drop_deleted(chunk)
                deleted += 1
        self._update_gauges()
        return deleted

    # ---- lending to pool peers -----------------------------------------------------

    @property
    def lent_bytes(self) -> int:
        """Bytes of chunks held for pool borrowers (the ledger's lent_bytes)."""
        return self._chunks.lent_bytes

    @property
    def pinned_lent_bytes(self) -> int:
        """Of `lent_bytes`, the pinned chunks' (a far segment's, while a worker attends it:
        never replaced by a newer loan). Read at each heartbeat: one walk of the borrowed."""
        now = self._clock()
        return sum(
            chunk.size_bytes
            for key in self._chunks.borrowed_keys()
            if (chunk := self._chunks[key]).pinned_until > now
        )

    def take_dropped_borrowed(self) -> list[tuple[str, bytes]]:
        """(borrower node, key) of chunks held for borrowers that this daemon evicted since
        the last call: the pool member tells their borrowers."""
        return self._chunks.take_dropped_borrowed()

    def forget_peer_copies(self, peer: str, keys: Sequence[bytes]) -> int:
        """Chunks that peer `peer` (its gRPC address) says it evicted: their copies there
        are forgotten at once, so Lookup stops offering them and no read fails on them; a
        chunk with no other copy leaves the store. A chunk placed elsewhere since is left
        alone. Returns how many placements were forgotten."""
        if self._peer is None:
            return 0
        forgotten = 0
        for key in keys:
            chunk = self._chunks.get(key)
            if chunk is None or not chunk.on_peer or self._peer.placed_on(key) != peer:
                continue
            self._peer.forget(key)
            chunk.on_peer = False
            forgotten += 1
            if chunk.blocks is None and not chunk.on_ssd:
                chunk.deleted = True  # no copy left: gone once nobody reads it
                self._mover.free_if_unread(chunk)
        metrics.PEER_COPIES_FORGOTTEN.inc(forgotten)
        self._update_gauges()
        return forgotten

    async def _make_lending_room(self, size_bytes: int) -> bool:
        """Whether a borrowed chunk of `size_bytes` fits the lending limits; a lender that
        replaces borrowed chunks (pool_replace_borrowed) first evicts what it holds for
        borrowers, least recently placed or read first, until it fits or none is left."""
        while not self._may_lend(size_bytes):
            if not self._lending.replace_borrowed or not await self._mover.evict_borrowed():
                return False
        return True

    def _may_lend(self, size_bytes: int) -> bool:
        """Whether a borrowed chunk fits the lending limits (pool_ledger.py's LendingLimits:
        free room above the floor, lent bytes under the ceiling) of the SSD tier, the only
        one borrowed chunks take (`commit`): counted against DRAM + SSD, the borrowed chunks
        then outgrew the SSD and evicted each other (test_pool_end_to_end reused nothing).
        The ledger ranks lenders by the same numbers, but from heartbeats: this check holds.
        Borrowed chunks reserved and not yet committed count as lent (and as taking SSD
        room), so a put of many chunks is checked including its own earlier ones: checked
        against what was lent before the put, one put overshot the ceiling by its size."""
        reserved = sum(r.size_bytes for r in self._reservations.values() if r.borrower)
        free = max(0, self.ssd.capacity_bytes - self.ssd.used_bytes - reserved)
        lent = self._chunks.lent_bytes + reserved
        return size_bytes <= self._lending.more_lendable_bytes(self.ssd.capacity_bytes, free, lent)

    def pin(self, namespace: bytes, keys: Sequence[bytes], ttl_seconds: float) -> int:
        self.namespaces.get(namespace)
        pinned = 0
        for key in keys:
            chunk = self._visible(namespace, key)
            if chunk is not None:
                chunk.pinned_until = self._clock() + ttl_seconds
                # A borrowed chunk is pinned to stay (its lender attends its own copy), not to be
                # read soon: it keeps off DRAM, the lender's node's (commit).
                if chunk.tier is TierName.SSD and not chunk.borrower:
                    self._mover.spawn(self._mover.promote_quietly(chunk, None))
                pinned += 1
        return pinned

    def unpin(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        self.namespaces.get(namespace)
        now, unpinned = self._clock(), 0
        for key in keys:
            chunk = self._visible(namespace, key)
            if chunk is not None and chunk.pinned_until > now:
                chunk.pinned_until = 0.0
                unpinned += 1
        return unpinned

    def hint(
        self,
        namespace: bytes,
        entries: Sequence[HintSpec],
        replace: bool,
        ttl_seconds: float,
        source: str = "",
    ) -> tuple[int, int]:
        """Records `source`'s hints; with the lookahead or predictive policy, starts
        prefetching. Returns (the source's live hints in the namespace, prefetches started)."""
        self.namespaces.get(namespace)
        hinted = self.hints.apply(namespace, entries, replace, ttl_seconds, self._clock(), source)
        for entry in entries:
            if entry.action is HintAction.PREDICT:
                metrics.PREDICTED_NEXT_USE.observe(entry.next_use_seconds)
        return hinted, self._mover.start_prefetches()

    # ---- periodic upkeep ------------------------------------------------------------

    async def maintain(self) -> None:
        """One upkeep pass: expiries, watermarks, prefetches. Called periodically."""
        now = self._clock()
        for write_id in [w for w, r in self._reservations.items() if r.expires_at <= now]:
            self._drop_reservation(self._reservations.pop(write_id))
            metrics.EXPIRED.labels("reservation").inc()
        for lease_id in [i for i, lease in self._leases.items() if lease.expires_at <= now]:
            self.release_lease(lease_id)
            metrics.EXPIRED.labels("lease").inc()
        self.hints.expire(now)
        self.ssd.recheck_room()  # another program may have filled (or freed) the disk
        await self._mover.enforce_watermarks()
        self.namespaces.save_if_changed()
        self._mover.start_prefetches()
        self._update_gauges()

    def stats(self) -> StoreStats:
        chunks = [c for c in self._chunks if not c.deleted]
        now = self._clock()
        return StoreStats(
            dram_capacity_bytes=self.dram.capacity_bytes,
            dram_used_bytes=self.dram.used_bytes,
            dram_chunks=sum(1 for c in chunks if c.blocks is not None),
            ssd_capacity_bytes=self.ssd.capacity_bytes,
            ssd_used_bytes=self.ssd.used_bytes,
            ssd_chunks=sum(1 for c in chunks if c.on_ssd),
            hits={tier: metrics.total(metrics.HITS, tier=tier.value) for tier in TierName},
            evictions={tier: metrics.total(metrics.EVICTIONS, tier=tier.value) for tier in TierName},
            misses=metrics.total(metrics.MISSES),
            promotions=metrics.total(metrics.PROMOTIONS),
            demotions=metrics.total(metrics.DEMOTIONS),
            reservations=len(self._reservations),
            leases=len(self._leases),
            pinned_chunks=sum(1 for c in chunks if c.pinned_until > now),
            namespaces=len(self.namespaces),
            max_namespaces=self.namespaces.max_namespaces,
            namespaces_refused={
                reason: metrics.total(metrics.NAMESPACE_REFUSALS, reason=reason)
                for reason in ("table_full", "rate_limited")
            },
            namespaces_reclaimed=metrics.total(metrics.NAMESPACES_RECLAIMED),
            admissions_declined=metrics.total(metrics.ADMISSIONS_DECLINED),
        )

    # ---- internals: visibility and readers -----------------------------------------

    def _visible(self, namespace: bytes, key: bytes) -> Chunk | None:
        chunk = self._chunks.get(key)
        if chunk is None or chunk.deleted or chunk.namespace != namespace:
            return None
        return chunk

    def _reservation(self, write_id: int) -> Reservation:
        reservation = self._reservations.get(write_id)
        if reservation is None:
            raise NotFound(
                f"write id {write_id} is unknown: never reserved, already committed or aborted, or expired"
            )
        return reservation

    def _count_hits(self, tiers: Sequence[TierName], misses: int) -> None:
        for tier in tiers:
            metrics.HITS.labels(tier.value).inc()
        metrics.MISSES.inc(misses)

    async def _acquire(self, namespace: bytes, keys: Sequence[bytes]) -> list[Chunk]:
        """Takes a reader on each chunk and makes it DRAM-resident; all or nothing."""
        self.namespaces.get(namespace)
        chunks = []
        for key in keys:
            chunk = self._visible(namespace, key)
            if chunk is None:
                self._count_hits([], misses=1)
                raise NotFound(f"chunk {key.hex()} is not stored (never committed, deleted or evicted)")
            chunks.append(chunk)
        self._count_hits([c.tier for c in chunks], misses=0)
        for chunk in chunks:
            chunk.readers += 1
            chunk.client_readers += 1
            self._mover.touch(chunk)
        try:
            for chunk in chunks:
                await self._mover.promote(chunk, None)
        except BaseException:
            self._release(chunks)
            raise
        return chunks

    def _release(self, chunks: Sequence[Chunk]) -> None:
        for chunk in chunks:
            chunk.readers -= 1
            chunk.client_readers -= 1
            self._mover.free_if_unread(chunk)

    def _drop_reservation(self, reservation: Reservation) -> None:
        self._reserved_keys.discard(reservation.key)
        self._ssd_only.discard(reservation.key)
        self.dram.free(reservation.blocks)

    def _check_written(self, reservation: Reservation) -> ChunkLayout:
        """The layout of a fully written reservation, or InvalidArgument saying what is wrong."""
        extents, size = reservation.extents, reservation.size_bytes
        data: memoryview | bytearray = (
            self.dram.arena.view[extents[0][0] : extents[0][0] + size]
            if len(extents) == 1
            else self.dram.arena.read(extents, 0, size)
        )
        where = f"write id {reservation.write_id} (chunk {reservation.key.hex()})"
        try:
            layout = decode_layout(data)
            if layout.total_bytes != size:
                raise ChunkFormatError(
                    f"the header describes {layout.total_bytes} bytes, {size} were reserved"
                )
            if layout.header.key != reservation.key or layout.header.namespace != reservation.namespace:
                raise ChunkFormatError("the header's key or namespace differs from the reservation's")
            self.namespaces.get(reservation.namespace).check_header(layout.header)
            verify_layers(data, layout, 0, layout.header.num_layers)
        except (ChunkFormatError, ChunkCorruptError, InvalidArgument) as exc:
            raise InvalidArgument(f"{where} is not a valid chunk: {exc}") from exc
        return layout

    def _update_gauges(self) -> None:
        metrics.USED_BYTES.labels("dram").set(self.dram.used_bytes)
        metrics.USED_BYTES.labels("ssd").set(self.ssd.used_bytes)
        metrics.CAPACITY_BYTES.labels("dram").set(self.dram.capacity_bytes)
        metrics.CAPACITY_BYTES.labels("ssd").set(self.ssd.capacity_bytes)
