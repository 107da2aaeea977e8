"""A mapping of the daemon's shared-memory arena, used by the daemon and by
same-node clients alike.

A chunk occupies a list of extents (arena offset, length) that together hold its
serialized bytes in order; reading or writing a byte range of the chunk walks them.
"""

from __future__ import annotations

import mmap
import os
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
