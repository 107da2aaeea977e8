"""A mapping of the daemon's shared-memory arena, used by the daemon and by
same-node clients alike.

A chunk occupies a list of extents (arena offset, length) that together hold its
serialized bytes in order; reading or writing a byte range of the chunk walks them.
"""

from __future__ import annotations

import mmap
import os
import platform
from collections.abc import Iterator, Sequence
from pathlib import Path

Extent = tuple[int, int]  # (arena offset, length) in bytes


def slice_extents(extents: Sequence[Extent], start: int, end: int) -> Iterator[Extent]:
    """Arena ranges holding bytes [start, end) of the chunk laid out over `extents`."""
    position = 0
    for offset, length in extents:
        if position >= end:
            return
        lo, hi = max(start, position), min(end, position + length)
        if lo < hi:
            yield offset + lo - position, hi - lo
        position += length
    if position < end:
        raise ValueError(f"range [{start}, {end}) runs past the chunk's {position} bytes")


class SharedArena:
    """A read-write mmap of an arena file."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        self.size_bytes = size_bytes
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size < size_bytes:
                raise ValueError(f"arena file {path} is smaller than {size_bytes} bytes")
            self._map = mmap.mmap(fd, size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.view = memoryview(self._map)

    def views(self, extents: Sequence[Extent], start: int, end: int) -> list[memoryview]:
        """Zero-copy views of bytes [start, end) of a chunk; valid while its lease holds."""
        return [self.view[offset : offset + length] for offset, length in slice_extents(extents, start, end)]

    def read_into(self, extents: Sequence[Extent], start: int, end: int, out: memoryview) -> None:
        """Copies bytes [start, end) of a chunk into `out` (len(out) == end - start)."""
        if out.nbytes != end - start:
            raise ValueError(f"output buffer holds {out.nbytes} bytes, range is {end - start}")
        position = 0
        for offset, length in slice_extents(extents, start, end):
            out[position : position + length] = self.view[offset : offset + length]
            position += length

    def read(self, extents: Sequence[Extent], start: int, end: int) -> bytearray:
        out = bytearray(end - start)
        self.read_into(extents, start, end, memoryview(out))
        return out

    def write(self, extents: Sequence[Extent], start: int, data: bytes | bytearray | memoryview) -> None:
        """Writes `data` at byte `start` of a chunk laid out over `extents`."""
        source = memoryview(data).cast("B")
        position = 0
        for offset, length in slice_extents(extents, start, start + source.nbytes):
            self.view[offset : offset + length] = source[position : position + length]
            position += length

    def close(self) -> None:
        self.view.release()
        self._map.close()


class BlockVersions:
    """A version counter per arena block, in the arena file after the blocks.

    The daemon bumps a block's version whenever the block stops holding the chunk it
    held (the block is freed, or its chunk deleted). Committed chunks never change in
    place, so a reader that recorded the versions of a chunk's blocks while it held a
    lease can later copy the chunk with no lease and no round trip, and keep the copy
    only if the versions are unchanged after copying: a seqlock read. Sound where loads
    are not reordered with earlier loads (x86-64); see `seqlock_reads_supported`.
    """

    ITEM_BYTES = 8

    def __init__(self, arena: SharedArena, offset_bytes: int, num_blocks: int, block_bytes: int) -> None:
        end = offset_bytes + num_blocks * self.ITEM_BYTES
        if offset_bytes % self.ITEM_BYTES or end > arena.size_bytes:
            raise ValueError(
                f"a version table of {num_blocks} blocks at {offset_bytes} does not fit the arena"
            )
        self.block_bytes = block_bytes
        self._table = arena.view[offset_bytes:end].cast("Q")

    def blocks_of(self, extents: Sequence[Extent]) -> tuple[int, ...]:
        """The blocks that hold a chunk laid out over `extents`."""
        return tuple(
            block
            for offset, length in extents
            for block in range(offset // self.block_bytes, -(-(offset + length) // self.block_bytes))
        )

    def read(self, blocks: Sequence[int]) -> tuple[int, ...]:
        return tuple(self._table[block] for block in blocks)

    def bump(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            self._table[block] += 1

    def release(self) -> None:
        """Drops the view of the table so the arena can be unmapped."""
        self._table.release()


def seqlock_reads_supported() -> bool:
    """Whether this CPU keeps loads in program order (x86-64's TSO), as version-checked
    reads need: Python has no load barrier to order them elsewhere."""
    return platform.machine().lower() in ("x86_64", "amd64")


SHARED_MEMORY_DIR = Path("/dev/shm")
DEFAULT_ARENA_ROOM_BYTES = 256 * 1024 * 1024


def arena_root(fallback: Path, room_bytes: int = DEFAULT_ARENA_ROOM_BYTES) -> Path:
    """Where a local daemon's arena goes: /dev/shm when this machine has one with
    `room_bytes` free, else `fallback` (a file-backed arena works the same, slower). A
    container's /dev/shm is often 64 MiB, too small for a store; nothing assumes it."""
    if SHARED_MEMORY_DIR.is_dir():
        stat = os.statvfs(SHARED_MEMORY_DIR)
        if stat.f_bavail * stat.f_frsize >= room_bytes:
            return SHARED_MEMORY_DIR
    return fallback
