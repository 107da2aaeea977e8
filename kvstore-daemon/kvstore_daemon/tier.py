"""The interface of a storage tier, as the TierMover moves chunks through it.

DRAM (`dram_tier.py`), SSD (`ssd_tier.py`) and the fault-injecting SSD of the tests
implement it; a peer tier would too. A tier keeps one copy of a chunk's bytes and its own
accounting; which tiers hold a copy is recorded on the `Chunk` (`blocks`, `on_ssd`) by the
mover, and the order in which copies leave is the mover's eviction policy, not the tier's.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from attnstore import errors
from attnstore.chunks.format import Buffer
from kvstore_daemon.chunk_entry import Chunk, TierName


class TierFull(errors.ResourceExhausted):
    """The copy does not fit; the caller evicts first (`has_room`)."""


class TierWriteError(errors.Unavailable):
    """The medium refused the write (ENOSPC, EROFS, EIO...); nothing was stored."""

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno


class TierCopyCorrupt(errors.DataLoss):
    """The tier's copy failed verification or vanished; the tier has dropped it."""


class Tier(Protocol):
    @property
    def name(self) -> TierName: ...

    @property
    def capacity_bytes(self) -> int:
        """What the tier may hold now (may change: see `recheck_room`)."""
        ...

    @property
    def used_bytes(self) -> int: ...

    def has_room(self, size_bytes: int) -> bool:
        """Whether a copy of `size_bytes` fits without evicting anything."""
        ...

    def recheck_room(self) -> None:
        """Re-reads what the medium can hold (a disk another program fills or frees)."""
        ...

    async def store(self, chunk: Chunk, data: Buffer) -> None:
        """Adds this tier's copy of `chunk`; raises TierFull or TierWriteError, storing nothing."""
        ...

    async def load(self, chunk: Chunk) -> Buffer:
        """The chunk's bytes from this tier's copy; raises TierCopyCorrupt (copy dropped) or
        KeyError (no copy)."""
        ...

    def discard(self, chunk: Chunk) -> asyncio.Future[None] | None:
        """Removes this tier's copy from its accounting at once. Slow cleanup (an unlink)
        goes on in the background, before any later store of the same key; its future is
        returned for a caller that needs the space back (None: nothing left to do)."""
        ...
