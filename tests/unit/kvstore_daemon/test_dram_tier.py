"""DramTier: block extents, the shared arena file, and cleanup after a crash."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnstore.shm_arena import BlockVersions, SharedArena
from kvstore_daemon.block_allocator import OutOfBlocks
from kvstore_daemon.dram_tier import ArenaError, DramTier, remove_stale_arenas

BLOCK = 4096
_DEAD_PID = 2**22 + 12345  # above Linux's pid_max limit, so never a live process


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[DramTier]:
    tier = DramTier(tmp_path, capacity_bytes=8 * BLOCK + 100, block_bytes=BLOCK)
    yield tier
    tier.close()


def test_sizes_round_down_to_whole_blocks(tier: DramTier) -> None:
    assert tier.capacity_bytes == tier.versions_offset_bytes == 8 * BLOCK
    assert tier.size_bytes == tier.path.stat().st_size == 8 * BLOCK + 8 * 8  # one uint64 version a block
    assert stat.S_IMODE(tier.path.stat().st_mode) == 0o660
    assert tier.path.name == f"attnstore-arena-{os.getpid()}-{tier.generation[:8]}.bin"
    assert [tier.blocks_for(n) for n in (0, 1, BLOCK, BLOCK + 1)] == [0, 1, 1, 2]


def test_allocate_and_free_track_used_bytes(tier: DramTier) -> None:
    blocks = tier.allocate(3 * BLOCK + 1)
    assert len(blocks) == 4
    assert (tier.used_bytes, tier.free_blocks) == (4 * BLOCK, 4)
    assert not tier.can_allocate(4 * BLOCK + 1)
    with pytest.raises(OutOfBlocks):
        tier.allocate(5 * BLOCK)
    tier.free(blocks)
    assert (tier.used_bytes, tier.free_blocks) == (0, 8)


def test_extents_merge_consecutive_blocks_and_trim_the_last(tier: DramTier) -> None:
    assert tier.extents([2, 3, 4, 7, 0, 1], 5 * BLOCK + 10) == [
        (2 * BLOCK, 3 * BLOCK),
        (7 * BLOCK, BLOCK),
        (0, BLOCK + 10),
    ]
    assert tier.extents([5], 1) == [(5 * BLOCK, 1)]
    assert tier.extents([4, 3], 2 * BLOCK) == [(4 * BLOCK, BLOCK), (3 * BLOCK, BLOCK)]
    with pytest.raises(ValueError):
        tier.extents([0, 1], BLOCK)  # one block too many


def test_bytes_written_through_the_arena_read_back_in_a_second_mapping(tier: DramTier) -> None:
    tier.allocate(1)  # so the chunk's blocks are not at offset 0
    size = 2 * BLOCK + 123
    data = os.urandom(size)
    blocks = tier.allocate(size)
    extents = tier.extents(blocks, size)
    tier.arena.write(extents, 0, data)
    assert bytes(tier.arena.read(extents, 0, size)) == data

    worker = SharedArena(tier.path, tier.size_bytes)  # what a same-node worker does
    try:
        assert bytes(worker.read(extents, 0, size)) == data
        worker.write(extents, 10, b"from the worker")
        assert bytes(tier.arena.read(extents, 10, 25)) == b"from the worker"
    finally:
        worker.close()


def test_freeing_or_invalidating_bumps_the_versions_a_second_mapping_sees(tier: DramTier) -> None:
    worker = SharedArena(tier.path, tier.size_bytes)
    versions = BlockVersions(worker, tier.versions_offset_bytes, 8, BLOCK)
    try:
        blocks = tier.allocate(2 * BLOCK + 1)
        before = versions.read(blocks)
        assert versions.blocks_of(tier.extents(blocks, 2 * BLOCK + 1)) == tuple(blocks)
        tier.invalidate(blocks[:1])
        assert versions.read(blocks) == (before[0] + 1, *before[1:])
        tier.free(blocks)
        assert versions.read(blocks) == (before[0] + 2, *(v + 1 for v in before[1:]))
        assert versions.read([b for b in range(8) if b not in blocks]) == (0,) * 5  # untouched
    finally:
        versions.release()
        worker.close()


def test_odd_block_sizes_keep_the_version_table_aligned(tmp_path: Path) -> None:
    tier = DramTier(tmp_path, capacity_bytes=3 * 4100, block_bytes=4100)
    try:
        assert tier.versions_offset_bytes % 64 == 0 and tier.versions_offset_bytes >= 3 * 4100
        tier.free(tier.allocate(4100))  # the daemon's own bump works through the table
    finally:
        tier.close()


def test_close_removes_the_file_and_is_idempotent(tmp_path: Path) -> None:
    tier = DramTier(tmp_path, capacity_bytes=2 * BLOCK, block_bytes=BLOCK)
    assert tier.path.exists()
    tier.close()
    tier.close()
    assert list(tmp_path.iterdir()) == []


def test_too_small_dir_fails_with_path_and_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    # A fake full tmpfs: really filling a disk in a unit test is not an option.
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(ArenaError, match=rf"reserve {4 * BLOCK + 4 * 8} bytes .*{tmp_path}.* bytes free"):
        DramTier(tmp_path, capacity_bytes=4 * BLOCK, block_bytes=BLOCK)
    assert list(tmp_path.iterdir()) == []  # nothing half-made left behind


def test_missing_dir_is_an_arena_error(tmp_path: Path) -> None:
    with pytest.raises(ArenaError, match="missing"):
        DramTier(tmp_path / "missing", capacity_bytes=BLOCK, block_bytes=BLOCK)


def test_remove_stale_arenas_keeps_live_ones(tmp_path: Path) -> None:
    dead = tmp_path / f"attnstore-arena-{_DEAD_PID}-0123abcd.bin"
    dead.write_bytes(b"x" * 100)
    previous_life = tmp_path / f"attnstore-arena-{os.getpid()}-89abcdef.bin"  # same pid, unlocked
    previous_life.write_bytes(b"x")
    other_live_pid = tmp_path / f"attnstore-arena-{os.getppid()}-0badf00d.bin"  # may be mid-create
    other_live_pid.write_bytes(b"x")
    unrelated = tmp_path / "attnstore-arena-notes.bin"
    unrelated.write_bytes(b"x")
    live = DramTier(tmp_path, capacity_bytes=BLOCK, block_bytes=BLOCK)
    try:
        assert remove_stale_arenas(tmp_path) == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [live.path.name, other_live_pid.name, unrelated.name]
        )
        assert remove_stale_arenas(tmp_path) == 0
    finally:
        live.close()


def test_a_client_probing_a_stale_arenas_lock_does_not_keep_it(tmp_path: Path) -> None:
    """A client checks the arena's lock with a brief shared flock; the cleaner takes the
    exclusive lock a moment later instead of counting the file as live."""
    dead = tmp_path / f"attnstore-arena-{_DEAD_PID}-0123abcd.bin"
    dead.write_bytes(b"x")
    probing = os.open(dead, os.O_RDONLY)
    fcntl.flock(probing, fcntl.LOCK_SH | fcntl.LOCK_NB)
    released = threading.Timer(0.015, fcntl.flock, (probing, fcntl.LOCK_UN))
    released.start()
    try:
        assert remove_stale_arenas(tmp_path) == 1
        assert not dead.exists()
    finally:
        released.join()
        os.close(probing)
