"""The three read paths a restore is measured on, each with the client's `iter_layers`
(layer-major LayerPieces of layers [layer_start, L)):

  dram       the daemon's DRAM tier through its shared-memory arena (AsyncKVStoreClient)
  ssd        chunk files on the work directory's disk, each (chunk, layer) read with pread
             after the page cache was dropped (posix_fadvise DONTNEED): the SSD tier's
             medium, cold, read layer by layer
  throttled  the daemon's DRAM reads released no faster than a set bandwidth: a remote node
             or a slow disk (the link's rate, not its latency)
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from attnstore.chunks.format import decode_layout, header_bytes_needed
from attnstore.kvstore_client import AsyncKVStoreClient, LayerPiece

PREAMBLE_BYTES = 16
READ_CHECK_BYTES = 64 * 1024 * 1024  # a read long enough to time: tens of ms from a disk
READ_CHECK_BLOCK_BYTES = 8 * 1024 * 1024


class FileTier:
    """Chunks as files `<dir>/<namespace hex>/<key hex>`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, namespace: bytes, key: bytes) -> Path:
        return self.directory / namespace.hex() / key.hex()

    def put(self, namespace: bytes, key: bytes, data: bytes) -> None:
        path = self._path(namespace, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())

    def drop_cache(self, namespace: bytes, keys: Sequence[bytes]) -> None:
        """Evicts the chunks' pages from the page cache: the next read comes from the disk."""
        for key in keys:
            _drop_pages(self._path(namespace, key))

    def read_check(self, size_bytes: int = READ_CHECK_BYTES) -> dict[str, float]:
        """GB/s of reading one file whole from the page cache and again after its pages were
        dropped: if the second is not the slower, dropping does not evict here and the disk
        tier reads from memory."""
        path = self.directory / "read-check"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as out:
            out.write(os.urandom(size_bytes))
            out.flush()
            os.fsync(out.fileno())
        try:
            _read_whole(path)  # into the page cache
            warm = _read_whole(path)
            _drop_pages(path)
            cold = _read_whole(path)
        finally:
            path.unlink()
        return {
            "warm_gbps": round(size_bytes / warm / 1e9, 3),
            "cold_gbps": round(size_bytes / cold / 1e9, 3),
        }

    async def iter_layers(
        self, namespace: bytes, keys: Sequence[bytes], *, layer_start: int = 0, layer_end: int = 0
    ) -> AsyncIterator[LayerPiece]:
        fds = [os.open(self._path(namespace, key), os.O_RDONLY) for key in keys]
        try:
            layouts = [decode_layout(await asyncio.to_thread(_read_header, fd)) for fd in fds]
            end = layer_end or layouts[0].header.num_layers
            for layer in range(layer_start, end):
                for index, (fd, layout) in enumerate(zip(fds, layouts, strict=True)):
                    start, stop = layout.layer_span(layer, layer + 1)
                    data = await asyncio.to_thread(os.pread, fd, stop - start, start)
                    yield LayerPiece(chunk_index=index, layer=layer, data=data, layout=layout)
        finally:
            for fd in fds:
                os.close(fd)


def _drop_pages(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read_whole(path: Path) -> float:
    """Seconds to read `path` whole, unbuffered, in 8 MiB reads."""
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as source:
        while source.read(READ_CHECK_BLOCK_BYTES):
            pass
    return time.perf_counter() - started


def _read_header(fd: int) -> bytes:
    preamble = os.pread(fd, PREAMBLE_BYTES, 0)
    return os.pread(fd, header_bytes_needed(preamble), 0)


class ThrottledReads:
    """The daemon's reads, each piece handed on no earlier than `bytes_per_second` allows."""

    def __init__(self, client: AsyncKVStoreClient, bytes_per_second: float) -> None:
        self.client = client
        self.bytes_per_second = bytes_per_second

    async def iter_layers(
        self, namespace: bytes, keys: Sequence[bytes], *, layer_start: int = 0, layer_end: int = 0
    ) -> AsyncIterator[LayerPiece]:
        started = time.perf_counter()
        moved = 0
        async for piece in self.client.iter_layers(
            namespace, keys, layer_start=layer_start, layer_end=layer_end
        ):
            moved += len(piece.data)
            wait = started + moved / self.bytes_per_second - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            yield piece
