"""The DRAM tier's memory: one shared-memory arena file cut into fixed-size blocks.

Same-node workers map the same file (`attnstore.shm_arena.SharedArena`) and copy chunk
bytes in and out directly; gRPC only tells them which extents to touch. The file name
carries the daemon's pid and a generation, so a worker can tell a restarted daemon's
arena from the one it mapped before.

While the daemon lives it holds an exclusive flock on its arena file. That lock, not
the pid alone, is what marks a file live: after a crash in a container the restarted
daemon often has the same pid (1) as the one that died.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from attnstore.chunks.format import Buffer
from attnstore.pids import pid_alive
from attnstore.shm_arena import BlockVersions, Extent, SharedArena
from kvstore_daemon.block_allocator import BlockAllocator, OutOfBlocks
from kvstore_daemon.chunk_entry import Chunk, TierName
from kvstore_daemon.tier import TierFull

_ARENA_NAME = re.compile(r"attnstore-arena-(\d+)-[0-9a-f]+\.bin")
# A stale file's lock refused this often, this far apart, belongs to a live daemon.
_LOCK_ATTEMPTS, _LOCK_RETRY_SECONDS = 5, 0.01


class ArenaError(RuntimeError):
    """The arena file cannot be created or reserved (a missing or too-small tmpfs)."""


class DramWatcher(Protocol):
    """Told on the event loop when a chunk's DRAM copy appears and before it is freed (the
    data plane's C reads keep a table of DRAM chunks: data_plane_reads.py)."""

    def arrived(self, chunk: Chunk) -> None: ...

    def leaving(self, chunk: Chunk) -> None: ...


class DramTier:
    """Owns the arena file, its mapping and the block allocator; knows nothing of keys. A
    `Tier` (tier.py): a chunk's copy here is the blocks recorded on its `Chunk`. Writers
    of shared memory also take blocks directly (`allocate`, then commit)."""

    def __init__(self, shm_dir: Path, capacity_bytes: int, block_bytes: int) -> None:
        if block_bytes < 1 or capacity_bytes < block_bytes:
            raise ValueError(f"capacity_bytes {capacity_bytes} must hold one block of {block_bytes} bytes")
        self._block_bytes = block_bytes
        self._allocator = BlockAllocator(capacity_bytes // block_bytes)
        num_blocks = self._allocator.num_blocks
        self._capacity_bytes = num_blocks * block_bytes  # no unusable tail
        self._versions_offset = -(-self._capacity_bytes // 64) * 64  # the version table follows the blocks
        self._size_bytes = self._versions_offset + num_blocks * BlockVersions.ITEM_BYTES
        self._generation = uuid.uuid4().hex
        self._path = shm_dir / f"attnstore-arena-{os.getpid()}-{self._generation[:8]}.bin"
        self._lock_fd = _create_locked(self._path, self._size_bytes)
        try:
            self._arena = SharedArena(self._path, self._size_bytes)
            self._versions = BlockVersions(self._arena, self._versions_offset, num_blocks, block_bytes)
        except BaseException:
            self._path.unlink(missing_ok=True)
            os.close(self._lock_fd)
            raise
        self._closed = False
        # Held while a chunk's blocks are freed and forgotten (`discard`) and while another
        # thread reads a chunk's blocks with their versions (`versioned_extents`): a block
        # then cannot be seen as the chunk's after its version was bumped.
        self._discard_lock = threading.Lock()
        self._watcher: DramWatcher | None = None

    def watch(self, watcher: DramWatcher) -> None:
        self._watcher = watcher

    def arrived(self, chunk: Chunk) -> None:
        """Tells the watcher `chunk`'s DRAM copy is ready: stored, or committed into blocks
        taken with `allocate`."""
        if self._watcher is not None:
            self._watcher.arrived(chunk)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def size_bytes(self) -> int:
        """Bytes of the arena file: the blocks, then their version table."""
        return self._size_bytes

    @property
    def capacity_bytes(self) -> int:
        """Usable bytes: the requested capacity rounded down to whole blocks."""
        return self._capacity_bytes

    @property
    def versions_offset_bytes(self) -> int:
        return self._versions_offset

    @property
    def block_bytes(self) -> int:
        return self._block_bytes

    @property
    def generation(self) -> str:
        return self._generation

    @property
    def arena(self) -> SharedArena:
        return self._arena

    @property
    def used_bytes(self) -> int:
        return self._allocator.used_count * self._block_bytes

    @property
    def free_blocks(self) -> int:
        return self._allocator.free_count

    @property
    def name(self) -> TierName:
        return TierName.DRAM

    def has_room(self, size_bytes: int) -> bool:
        return self.can_allocate(size_bytes)

    def recheck_room(self) -> None:
        """The arena was reserved whole at start: its room never changes."""

    async def store(self, chunk: Chunk, data: Buffer) -> None:
        try:
            blocks = self.allocate(chunk.size_bytes)
        except OutOfBlocks as exc:
            raise TierFull(str(exc)) from exc
        extents = self.extents(blocks, chunk.size_bytes)
        self._arena.write(extents, 0, data)
        chunk.blocks, chunk.extents = blocks, extents
        self.arrived(chunk)

    async def load(self, chunk: Chunk) -> Buffer:
        if chunk.extents is None:
            raise KeyError(chunk.key)
        return self._arena.read(chunk.extents, 0, chunk.size_bytes)

    def discard(self, chunk: Chunk) -> None:
        if chunk.blocks is not None:
            if self._watcher is not None:
                self._watcher.leaving(chunk)
            with self._discard_lock:
                self.free(chunk.blocks)
                chunk.blocks = chunk.extents = None

    def versioned_extents(self, chunk: Chunk) -> tuple[list[Extent], tuple[int, ...], tuple[int, ...]] | None:
        """From any thread: the chunk's extents, blocks and their versions, read together; None
        when it has no DRAM copy. Bytes copied from the extents are the chunk's if
        `unchanged(blocks, versions)` after the copy (a seqlock read, as a worker's lease-free
        copy of the arena: `shm_arena.BlockVersions`)."""
        with self._discard_lock:
            blocks, extents = chunk.blocks, chunk.extents
            if blocks is None or extents is None:
                return None
            return extents, tuple(blocks), self._versions.read(blocks)

    def unchanged(self, blocks: Sequence[int], versions: tuple[int, ...]) -> bool:
        return self._versions.read(blocks) == versions

    def blocks_for(self, size_bytes: int) -> int:
        if size_bytes < 0:
            raise ValueError(f"size_bytes must not be negative, got {size_bytes}")
        return -(-size_bytes // self._block_bytes)

    def can_allocate(self, size_bytes: int) -> bool:
        return self._allocator.can_allocate(self.blocks_for(size_bytes))

    def allocate(self, size_bytes: int) -> list[int]:
        """Blocks for a chunk of `size_bytes` (>= 1); raises OutOfBlocks when short."""
        return self._allocator.allocate(self.blocks_for(size_bytes))

    def free(self, blocks: Sequence[int]) -> None:
        self._versions.bump(blocks)
        self._allocator.free(blocks)

    def invalidate(self, blocks: Sequence[int]) -> None:
        """Ends version-checked reads of the chunk in `blocks` (deleted, still leased)."""
        self._versions.bump(blocks)

    def extents(self, blocks: Sequence[int], size_bytes: int) -> list[Extent]:
        """Arena (offset, length) pairs holding a chunk's `size_bytes` bytes, in order.

        Runs of consecutive block ids become one extent (fewer copies for the client);
        the last extent stops at the chunk's end, not the block's.
        """
        if len(blocks) != self.blocks_for(size_bytes):
            raise ValueError(
                f"{size_bytes} bytes need {self.blocks_for(size_bytes)} blocks, got {len(blocks)}"
            )
        runs: list[list[int]] = []  # [first block, block count]
        for block in blocks:
            if runs and block == runs[-1][0] + runs[-1][1]:
                runs[-1][1] += 1
            else:
                runs.append([block, 1])
        extents = [(first * self._block_bytes, count * self._block_bytes) for first, count in runs]
        if extents:
            offset, length = extents[-1]
            extents[-1] = (offset, length - (len(blocks) * self._block_bytes - size_bytes))
        return extents

    def close(self) -> None:
        """Unmaps and removes the arena file; workers' own mappings stay valid until they unmap."""
        if self._closed:
            return
        self._closed = True
        try:
            self._versions.release()
            self._arena.close()
        finally:
            self._path.unlink(missing_ok=True)
            os.close(self._lock_fd)


def _create_locked(path: Path, size_bytes: int) -> int:
    """Creates the arena file, locks it and reserves its memory; returns the locked fd."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o660)
    except OSError as e:
        raise ArenaError(f"cannot create arena file {path}: {e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.fchmod(fd, 0o660)  # group-readable whatever the umask: workers share the group
        try:
            # Reserve now so a too-small tmpfs fails at start, not with SIGBUS mid-write.
            os.posix_fallocate(fd, 0, size_bytes)
        except OSError as e:
            stat = os.statvfs(path.parent)
            raise ArenaError(
                f"cannot reserve {size_bytes} bytes for arena file {path}: {e.strerror};"
                f" {stat.f_bavail * stat.f_frsize} bytes free in {path.parent}"
            ) from e
    except BaseException:
        path.unlink(missing_ok=True)
        os.close(fd)
        raise
    return fd


def remove_stale_arenas(shm_dir: Path) -> int:
    """Removes arena files left by dead daemons; returns how many were removed.

    A file is stale when no process holds its lock and its pid is either gone or our
    own (a previous life of this daemon in a fresh pid namespace). A live other pid
    with no lock is kept: that daemon may be between creating and locking its file.
    """
    removed = 0
    for path in shm_dir.glob("attnstore-arena-*-*.bin"):
        match = _ARENA_NAME.fullmatch(path.name)
        if match is None or not (not pid_alive(int(match[1])) or int(match[1]) == os.getpid()):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            if _lock_exclusive(fd):
                path.unlink(missing_ok=True)  # while locked, so no other cleaner counts it too
                removed += 1
        finally:
            os.close(fd)
    return removed


def _lock_exclusive(fd: int) -> bool:
    """Takes the file's exclusive flock; False when a live DramTier holds it. A client
    checking whether the arena's daemon lives holds a shared lock for two syscalls
    (kvstore_client/arena.py), so a refusal is retried before the file counts as live."""
    for attempt in range(_LOCK_ATTEMPTS):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < _LOCK_ATTEMPTS:
                time.sleep(_LOCK_RETRY_SECONDS)
    return False
