"""Durable renames: after os.replace() the directory entry itself must reach the disk, or a
crash can lose the renamed file even though its bytes were fsynced."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(path: Path) -> None:
    handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
