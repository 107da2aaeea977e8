"""Daemon processes of the pool benchmark: each with its own directories and arena."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attnstore.shm_arena import arena_root
from kvstore_daemon.launcher import DaemonProcess


@contextmanager
def daemon(root: Path, name: str, settings: dict[str, object]) -> Iterator[DaemonProcess]:
    """A started daemon under `root / name` (its arena under /dev/shm where it has room),
    stopped on exit."""
    shm_dir = Path(tempfile.mkdtemp(prefix="attnstore-bench-", dir=arena_root(root)))
    process = DaemonProcess(
        root / name / "ssd", shm_dir, root / f"{name}.log", {"log_level": "WARNING", **settings}
    )
    try:
        process.start()
        yield process
    finally:
        process.stop()
        shutil.rmtree(shm_dir, ignore_errors=True)
