"""What a local stack writes to disk, said out loud: the SSD tier, Redis' files and the
logs all live under the data directory, so one filling the disk starves the others. The
daemon bounds its own share (it keeps ssd_reserved_bytes free and evicts under pressure);
Redis' append-only file and the logs are not bounded, so `attnstore up` says when they
share a filesystem and how much room is left, and when the SSD tier cannot get the
capacity it was given."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

GiB = 1024**3


def disk_warnings(data_dir: Path, ssd_capacity_bytes: int) -> list[str]:
    """Lines to print about the data directory's filesystem (none when all is well)."""
    free = shutil.disk_usage(data_dir).free
    lines = [
        (
            f"the SSD tier, Redis' files and the logs share {data_dir}'s filesystem ({free / GiB:.1f} GiB free): "
            "Redis' append-only file and the logs are not bounded, so for long runs give `attnstore up` "
            "a --data-dir on a disk of its own"
        )
    ]
    if free < ssd_capacity_bytes:
        lines.append(
            f"the SSD tier was given {ssd_capacity_bytes / GiB:.1f} GiB but only {free / GiB:.1f} GiB is free: "
            "it will hold what fits and evict under pressure (--ssd-gib to size it)"
        )
    return lines if _one_filesystem(data_dir) else lines[1:]


def _one_filesystem(data_dir: Path) -> bool:
    """Whether the data directory's children (ssd, redis, logs) sit on one device: they do
    unless someone mounted a disk under it."""
    devices = {os.stat(path).st_dev for path in [data_dir, *data_dir.iterdir()] if path.is_dir()}
    return len(devices) == 1
