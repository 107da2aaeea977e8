"""The records the chunk store keeps per chunk, reservation and lease."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum

from attnstore.chunks.format import ChunkLayout
from attnstore.shm_arena import Extent


class TierName(Enum):
    DRAM = "dram"
    SSD = "ssd"
    PEER = "peer"  # a copy placed on another daemon (peer_tier.py)


class ReserveStatus(Enum):
    RESERVED = "reserved"
    ALREADY_STORED = "already_stored"
    IN_PROGRESS = "in_progress"
    NO_SPACE = "no_space"


@dataclass(eq=False)
class Chunk:
    """A committed chunk. `blocks` is set while it has a DRAM copy, `on_ssd` while it
    has an SSD copy, `on_peer` while a peer holds one; at least one holds unless it is
    being dropped."""

    key: bytes
    namespace: bytes
    size_bytes: int
    layout: ChunkLayout | None = None  # parsed lazily for chunks recovered from SSD
    blocks: list[int] | None = None
    extents: list[Extent] | None = None
    on_ssd: bool = False
    on_peer: bool = False  # a copy placed on another daemon (the mover's peer tier)
    borrower: str = ""  # the pool node that placed it here (ReservePut's borrower); "" = this node's own
    readers: int = 0  # leases and in-flight copies; a chunk with readers is never freed
    client_readers: int = 0  # the part of `readers` that is clients' leases, Gets and sends
    pinned_until: float = 0.0
    deleted: bool = False  # hidden; freed when the last reader leaves
    persist_task: asyncio.Task[bool] | None = None
    promote_task: asyncio.Task[None] | None = None

    @property
    def tier(self) -> TierName:
        """The fastest tier holding a copy."""
        if self.blocks is not None:
            return TierName.DRAM
        return TierName.SSD if self.on_ssd else TierName.PEER


@dataclass(eq=False)
class Reservation:
    write_id: int
    key: bytes
    namespace: bytes
    size_bytes: int
    blocks: list[int]
    extents: list[Extent]
    expires_at: float
    streamed_bytes: int = 0  # bytes that came through WritePut rather than shared memory
    borrower: str = ""  # a pool placement's borrower node (Chunk.borrower)


@dataclass(frozen=True)
class ReserveResult:
    key: bytes
    status: ReserveStatus
    write_id: int = 0
    extents: tuple[Extent, ...] = ()


@dataclass(eq=False)
class Lease:
    lease_id: int
    chunks: list[Chunk]
    expires_at: float


@dataclass(frozen=True)
class StoreStats:
    dram_capacity_bytes: int
    dram_used_bytes: int
    dram_chunks: int
    ssd_capacity_bytes: int
    ssd_used_bytes: int
    ssd_chunks: int
    hits: dict[TierName, int] = field(default_factory=dict)
    evictions: dict[TierName, int] = field(default_factory=dict)
    misses: int = 0
    promotions: int = 0
    demotions: int = 0
    reservations: int = 0
    leases: int = 0
    pinned_chunks: int = 0
    namespaces: int = 0
    max_namespaces: int = 0
    namespaces_refused: dict[str, int] = field(default_factory=dict)  # by reason: table_full, rate_limited
    namespaces_reclaimed: int = 0
    admissions_declined: int = 0
