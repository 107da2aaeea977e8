"""One real daemon process for a test module or test, its arena in a private folder of
/dev/shm where that has room (else under `root`): shared by the worker's, the vLLM
connector's and the hint pushers' tests (tests/ is on sys.path through the root conftest)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from attnstore.shm_arena import arena_root
from kvstore_daemon.launcher import DaemonProcess

MiB = 1024 * 1024


@contextmanager
def running_daemon(
    root: Path, *, dram_bytes: int, ssd_bytes: int, settings: Mapping[str, object] | None = None
) -> Iterator[DaemonProcess]:
    """A started daemon with these tier capacities (chunks up to 16 MiB) and any further
    `settings`; stopped and its arena folder removed on exit."""
    shm_dir = Path(tempfile.mkdtemp(prefix="attnstore-test-", dir=arena_root(root, dram_bytes)))
    process = DaemonProcess(
        ssd_dir=root / "ssd",
        shm_dir=shm_dir,
        log_path=root / "daemon.log",
        settings={
            "DRAM_CAPACITY_BYTES": dram_bytes,
            "SSD_CAPACITY_BYTES": ssd_bytes,
            "MAX_CHUNK_BYTES": 16 * MiB,
            **(settings or {}),
        },
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()
        shutil.rmtree(shm_dir, ignore_errors=True)
