"""SSD tier reads vs raw direct reads of the same chunk files, both cold.

Method: the chunks are published by `SsdTier.write` (temp file, fsync, rename). Before
every timed read, on both sides, the file's page cache is evicted (fsync, then
posix_fadvise(POSIX_FADV_DONTNEED)), so both read from the device. The tier side is
`SsdTier.read` (an I/O thread reads the whole file into a new buffer, then every layer
checksum is verified); the raw side opens the file with O_DIRECT and reads it whole into
a page-aligned mmap buffer. Where O_DIRECT is refused, the raw side falls back to a
plain read of the just-evicted file, and says so. The two sides alternate read by read,
so drifts of the device hit both alike.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from pathlib import Path

from bench.common.harness import Budget, Measurement
from bench.daemon.workloads import ChunkPool
from kvstore_daemon.ssd_tier import SsdTier

_ALIGN = 4096
WARMUP_PAIRS = 2


def evict_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class RawReader:
    """Whole-file reads into one preallocated page-aligned buffer."""

    def __init__(self, max_bytes: int) -> None:
        self._map = mmap.mmap(-1, -(-max_bytes // _ALIGN) * _ALIGN)  # anonymous maps are page-aligned
        self.view = memoryview(self._map)
        self.method = "O_DIRECT" if hasattr(os, "O_DIRECT") else "fadvise(DONTNEED) + read"

    def read(self, path: Path) -> int:
        """Bytes read; switches to the fallback the first time O_DIRECT is refused."""
        if self.method == "O_DIRECT":
            try:
                return self._read(path, os.O_DIRECT)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.method = f"fadvise(DONTNEED) + read (O_DIRECT refused: {exc.strerror})"
        return self._read(path, 0)

    def _read(self, path: Path, flags: int) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
        try:
            size = os.fstat(fd).st_size
            end = -(-size // _ALIGN) * _ALIGN  # O_DIRECT lengths are whole pages; EOF cuts the last
            done = 0
            while done < size:
                got = os.preadv(fd, [self.view[done:end]], done)
                if got == 0:
                    break
                done += got
            return done
        finally:
            os.close(fd)

    def close(self) -> None:
        self.view.release()
        self._map.close()


async def measure_cold_reads(
    tier: SsdTier, raw: RawReader, pool: ChunkPool, budget: Budget
) -> tuple[Measurement, Measurement]:
    """(tier, raw) cold whole-chunk reads of `pool`, written to `tier` first and deleted after."""
    for key, chunk in zip(pool.keys, pool.chunks, strict=True):
        await tier.write(key, pool.namespace, chunk)
    try:
        _check_same_bytes(await tier.read(pool.keys[0]), raw, tier.path_of(pool.keys[0]), pool.chunks[0])
        tier_result, raw_result = Measurement(pool.chunk_bytes), Measurement(pool.chunk_bytes)
        pair = 0
        while pair < WARMUP_PAIRS or not budget.done(
            tier_result.ops + raw_result.ops,
            tier_result.moved_bytes + raw_result.moved_bytes,
            tier_result.seconds + raw_result.seconds,
        ):
            key = pool.keys[pair % pool.count]
            path = tier.path_of(key)
            evict_page_cache(path)
            start = time.perf_counter()
            await tier.read(key)
            tier_s = time.perf_counter() - start
            evict_page_cache(path)
            start = time.perf_counter()
            raw.read(path)
            raw_s = time.perf_counter() - start
            if pair >= WARMUP_PAIRS:
                for result, seconds in ((tier_result, tier_s), (raw_result, raw_s)):
                    result.latencies_s.append(seconds)
                    result.seconds += seconds  # one read in flight: wall time is the sum
            pair += 1
        return tier_result, raw_result
    finally:
        for key in pool.keys:
            await tier.delete(key)


def _check_same_bytes(tier_bytes: bytearray, raw: RawReader, path: Path, expected: bytes) -> None:
    evict_page_cache(path)
    got = raw.read(path)
    if bytes(tier_bytes) != expected or raw.view[:got] != expected:
        raise RuntimeError(f"{path}: bytes read back differ from the chunk written")
