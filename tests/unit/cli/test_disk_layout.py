"""`attnstore up` says where its data shares a disk and when the SSD tier cannot get its
capacity (issue 26.5: one filling the disk must not starve the others silently)."""

from __future__ import annotations

import shutil
from pathlib import Path

from attnstore_cli.disk_layout import disk_warnings


def _data_dir(root: Path) -> Path:
    for child in ("ssd", "redis", "logs"):
        (root / child).mkdir()
    return root


def test_a_shared_filesystem_is_named_with_its_free_space(tmp_path: Path) -> None:
    lines = disk_warnings(_data_dir(tmp_path), ssd_capacity_bytes=1)
    assert len(lines) == 1 and "share" in lines[0] and "GiB free" in lines[0]


def test_an_ssd_tier_larger_than_the_free_space_is_said(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    lines = disk_warnings(_data_dir(tmp_path), ssd_capacity_bytes=free * 2)
    assert any("only" in line and "evict under pressure" in line for line in lines)
