"""The client's view of the daemon's shared-memory arena: mapped on first use, remapped
when the daemon recreates it, given up for good when this process cannot map it."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path

import grpc

from attnstore.errors import Unavailable
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.shm_arena import BlockVersions, SharedArena, seqlock_reads_supported

# Status codes of an OpenShm that mean "this daemon offers no arena", not "daemon down".
_NO_SHM_CODES = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION)


class ArenaHandle:
    """States: unopened -> mapped(generation) -> mapped(new generation) ... or -> unavailable.

    Unavailable is final: the arena file is not reachable from here (a daemon on another
    node, or another mount namespace), and every transfer then goes over gRPC.
    """

    def __init__(
        self,
        stub: kvstore_pb2_grpc.KVStoreStub,
        *,
        enabled: bool,
        shm_dir: Path | None,
        timeout_seconds: float,
    ) -> None:
        self._stub = stub
        self._shm_dir = shm_dir
        self._timeout_seconds = timeout_seconds
        self._arena: SharedArena | None = None
        self._versions: BlockVersions | None = None  # None: no version-checked reads
        self._owner_fd: int | None = None  # the arena file, to see whether its daemon lives
        self._generation = ""
        self._unavailable = not enabled
        self._lock = asyncio.Lock()  # one OpenShm + mmap at a time

    async def available(self) -> bool:
        """Whether transfers can go through shared memory; maps the arena on first call."""
        if self._arena is None and not self._unavailable:
            async with self._lock:
                if self._arena is None and not self._unavailable:
                    await self._map()
        return self._arena is not None

    async def for_generation(self, generation: str) -> SharedArena:
        """The mapping that extents tagged `generation` refer to. A different generation
        means the daemon recreated its arena: remap before touching memory."""
        if self._arena is not None and self._generation == generation:
            return self._arena
        async with self._lock:
            if self._arena is None or self._generation != generation:
                await self._map()
        if self._arena is None or self._generation != generation:
            raise Unavailable("the daemon's shared-memory arena changed during the call; retry")
        return self._arena

    @property
    def generation(self) -> str:
        """The generation of the mapped arena ("" when none is mapped)."""
        return self._generation

    @property
    def mapped(self) -> SharedArena | None:
        return self._arena

    @property
    def versions(self) -> BlockVersions | None:
        """The mapped arena's block versions while version-checked reads of it are sound:
        on x86-64, and while the daemon that owns it lives. A daemon that dies leaves its
        versions as they were, so once its exclusive lock on the file is gone, reads lease
        again (and find the new daemon's arena)."""
        if (
            self._versions is not None
            and self._owner_fd is not None
            and not _locked_by_another(self._owner_fd)
        ):
            self._versions = None
        return self._versions

    async def _map(self) -> None:
        try:
            reply = await self._stub.OpenShm(kvstore_pb2.OpenShmRequest(), timeout=self._timeout_seconds)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _NO_SHM_CODES:
                raise
            self._give_up()
            return
        path = Path(reply.path)
        if self._shm_dir is not None:  # the same tmpfs mounted elsewhere in this container
            path = self._shm_dir / path.name
        try:
            arena = SharedArena(path, reply.size_bytes)
        except (OSError, ValueError):
            self._give_up()  # remote daemon or unshared /dev/shm: use the gRPC stream
            return
        versions, owner_fd = None, None
        if reply.block_versions_offset_bytes and seqlock_reads_supported():
            count = (reply.size_bytes - reply.block_versions_offset_bytes) // BlockVersions.ITEM_BYTES
            versions = BlockVersions(arena, reply.block_versions_offset_bytes, count, reply.block_bytes)
            owner_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._close_owner_fd()
        # The old mapping is dropped, not closed: a reader may still hold views of it,
        # and the garbage collector unmaps it once they are gone.
        self._arena, self._versions, self._generation = arena, versions, reply.arena_generation
        self._owner_fd = owner_fd

    def _close_owner_fd(self) -> None:
        if self._owner_fd is not None:
            os.close(self._owner_fd)
            self._owner_fd = None

    def _give_up(self) -> None:
        self._close_owner_fd()
        self._arena, self._versions, self._generation, self._unavailable = None, None, "", True

    def close(self) -> None:
        if self._versions is not None:
            self._versions.release()
        if self._arena is not None:
            with contextlib.suppress(BufferError):  # views still exported: GC unmaps later
                self._arena.close()
        self._give_up()


def _locked_by_another(fd: int) -> bool:
    """Whether some process holds an exclusive flock on the file (the daemon does on its
    arena, for as long as it lives)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False
