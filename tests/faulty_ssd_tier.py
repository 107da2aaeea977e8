"""An SsdTier whose disk misbehaves on demand, for tests of the failure paths: the
fault-injecting twin of the daemon's tiers (a `Tier`, kvstore_daemon/tier.py).

Faults are injected at the lowest layer (the blocking file calls on the I/O threads), so
everything above them, cleanup and verification included, runs as in production.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kvstore_daemon.ssd_tier import DEFAULT_IO_THREADS, SsdTier


class FaultySsdTier(SsdTier):
    """Knobs are plain attributes; set them at any time."""

    def __init__(
        self, dirs: Sequence[Path], capacity_bytes: int, io_threads: int = DEFAULT_IO_THREADS
    ) -> None:
        super().__init__(dirs, capacity_bytes, io_threads)
        self.fail_writes_with: int | None = None  # errno raised mid-write (ENOSPC, EROFS...)
        self.corrupt_next_reads = 0  # this many reads get one flipped byte before verification
        self.read_delay_seconds = 0.0  # a slow disk: each read blocks its I/O thread this long
        self.write_delay_seconds = 0.0  # holds a write in flight (to race deletes against it)
        self.reads_started = 0  # file reads begun (an I/O thread took them up), faulty or not
        self._lock = threading.Lock()  # the counters change on I/O threads

    def _write_file(self, fd: int, data: memoryview) -> None:
        if self.write_delay_seconds:
            time.sleep(self.write_delay_seconds)
        code = self.fail_writes_with
        if code is not None:
            os.write(fd, data[: data.nbytes // 2])  # a partial temp file that must not survive
            raise OSError(code, os.strerror(code))
        super()._write_file(fd, data)

    def _read_file(self, path: Path) -> bytearray:
        with self._lock:
            self.reads_started += 1
        if self.read_delay_seconds:
            time.sleep(self.read_delay_seconds)
        data = super()._read_file(path)
        with self._lock:
            corrupt = self.corrupt_next_reads > 0
            self.corrupt_next_reads -= corrupt
        if corrupt and data:
            data[-1] ^= 0xFF  # the last byte lies in the last layer, so only a checksum sees it
        return data
