"""The SSD tier: chunk files in one or more directories, written round-robin across them.

    <dir>/chunks/<key_hex[:2]>/<key_hex>.chunk           a published chunk of this node
    <dir>/chunks/<key_hex[:2]>/<key_hex>@<borrower>.chunk  one held for a pool borrower (its
                                                          node, base64url of its UTF-8 name)
    <dir>/chunks/<key_hex[:2]>/<key_hex>.<random>.tmp     a write in progress (or interrupted)

Keys are globally unique (the namespace is hashed into them and kept in each header), so
the file name alone identifies a chunk and the index is rebuilt from the disk at open();
the borrower in the name survives a restart with the chunk (published by the same rename),
so a lender still counts what it holds for each borrower after one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import structlog

from attnstore import errors
from attnstore.chunks.format import (
    Buffer,
    ChunkCorruptError,
    ChunkFormatError,
    ChunkLayout,
    decode_layout,
    header_bytes_needed,
    verify_layers,
)
from attnstore.chunks.keys import KEY_BYTES
from attnstore.fsync import fsync_directory
from kvstore_daemon.chunk_entry import Chunk, TierName
from kvstore_daemon.tier import TierCopyCorrupt, TierFull, TierWriteError

_T = TypeVar("_T")
_CHUNK_SUFFIX = ".chunk"
_BORROWER_MARK = "@"
_TMP_SUFFIX = ".tmp"
_HEADER_PROBE_BYTES = 4096  # one page: holds every real header, so one pread usually suffices
DEFAULT_IO_THREADS = 4  # the daemon setting io_threads defaults to this

log = structlog.get_logger("attnstore.ssd_tier")


class SsdFullError(TierFull):
    """The write would take the tier past capacity_bytes; the caller evicts first."""


class SsdWriteError(TierWriteError):
    """The OS refused a write (ENOSPC, EROFS, EIO...); nothing was published."""

    def __init__(self, key: bytes, exc: OSError) -> None:
        super().__init__(f"writing chunk {key.hex()} to SSD failed: {exc.strerror or exc}", exc.errno)
        self.key = key


class SsdReadError(errors.Unavailable):
    """Reading failed for a reason that says nothing about the chunk's bytes (EMFILE...);
    the chunk is kept."""


class SsdChunkCorrupt(TierCopyCorrupt):
    """A chunk file failed verification or vanished; it is dropped, so callers see a miss."""

    def __init__(self, key: bytes, reason: str) -> None:
        super().__init__(f"chunk {key.hex()} on SSD was dropped: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True, slots=True)
class StoredChunk:
    key: bytes
    namespace: bytes
    size_bytes: int
    borrower: str = ""  # the pool node it is held for ("": this node's own)


@dataclass(frozen=True, slots=True)
class _Entry:
    path: Path
    size_bytes: int
    namespace: bytes
    borrower: str


@dataclass(slots=True)
class _PendingWrite:
    size_bytes: int
    deleted: bool = False  # set by delete() while the bytes are in flight


class SsdTier:
    """Chunk files on local disks, one index in memory; a `Tier` (tier.py).

    Lifecycle of a key (index and counters change only on the event-loop thread):

        absent --write--> writing --rename+fsync--> published --delete/corrupt--> removing --> absent
                            |  (temp file, invisible;            (in the index;       (index entry gone,
                            |   counted in pending_bytes)         readable)            file being unlinked)
                            +--delete--> published file is unlinked when the write lands

    At most one file operation per key is in flight (`_busy`); a write of a key waits for
    the previous one (write or unlink) to finish, so an unlink never races a re-publish.
    """

    def __init__(
        self,
        dirs: Sequence[Path],
        capacity_bytes: int,
        io_threads: int = DEFAULT_IO_THREADS,
        *,
        reserve_bytes: int = 0,
    ) -> None:
        """`capacity_bytes` is what the tier may use at most; the disks may hold less, see
        `recheck_room`. `reserve_bytes` are left free on the disks for other files (the
        namespace file)."""
        if not dirs:
            raise errors.InvalidArgument("SsdTier needs at least one directory")
        self._dirs = [Path(d) for d in dirs]
        self._configured_bytes = capacity_bytes
        self._capacity_bytes = capacity_bytes
        self._reserve_bytes = reserve_bytes
        self._executor = ThreadPoolExecutor(io_threads, thread_name_prefix="ssd-io")
        self._index: dict[bytes, _Entry] = {}
        self._writing: dict[bytes, _PendingWrite] = {}
        self._busy: dict[bytes, asyncio.Task[None]] = {}
        self._published_bytes = 0
        self._pending_bytes = 0
        self._next_dir = 0
        self._state = "new"  # new -> open -> closed
        self.recovery_dropped = 0
        self.corrupt_dropped = 0

    # --- lifecycle ---------------------------------------------------------------------

    async def open(self) -> list[StoredChunk]:
        """Creates the directories and rebuilds the index from what survived on disk."""
        if self._state != "new":
            raise errors.FailedPrecondition(f"SsdTier.open() on a tier that is {self._state}")
        scans = await asyncio.gather(*(self._run(self._scan_dir, d) for d in self._dirs))
        for found, dropped in scans:
            self.recovery_dropped += dropped
            for key, entry in found:
                if key in self._index:  # only after a failed unlink; one copy is enough
                    await self._run(_unlink_quietly, entry.path)
                    self.recovery_dropped += 1
                    continue
                self._index[key] = entry
                self._published_bytes += entry.size_bytes
        self._state = "open"
        if self.recovery_dropped:
            log.warning("ssd_recovery_dropped", chunks=self.recovery_dropped)
        self.recheck_room()
        return [StoredChunk(k, e.namespace, e.size_bytes, e.borrower) for k, e in self._index.items()]

    async def close(self) -> None:
        """Lets in-flight writes and unlinks land, then stops the I/O threads."""
        if self._state == "closed":
            return
        self._state = "closed"
        while self._busy:
            await asyncio.wait(list(self._busy.values()))
        await asyncio.to_thread(self._executor.shutdown, True)

    # --- queries (no I/O) --------------------------------------------------------------

    def contains(self, key: bytes) -> bool:
        return key in self._index

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def size_of(self, key: bytes) -> int:
        return self._index[key].size_bytes

    def namespace_of(self, key: bytes) -> bytes:
        return self._index[key].namespace

    def path_of(self, key: bytes) -> Path:
        """Where the chunk lies (for benchmarks that compare against raw reads of it)."""
        return self._index[key].path

    def keys(self) -> list[bytes]:
        return list(self._index)

    @property
    def used_bytes(self) -> int:
        """Bytes of published chunks plus writes in flight: both count against capacity,
        so a caller that evicts until `used_bytes + size <= capacity_bytes` can write."""
        return self._published_bytes + self._pending_bytes

    @property
    def pending_bytes(self) -> int:
        """The part of used_bytes that is still being written."""
        return self._pending_bytes

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def name(self) -> TierName:
        return TierName.SSD

    def has_room(self, size_bytes: int) -> bool:
        return self.used_bytes + size_bytes <= self._capacity_bytes

    def recheck_room(self) -> None:
        """Sets the capacity to what the disks can hold: at most the configured bytes, and at
        most our bytes plus the space free on the disks less the reserve (another program
        may fill a shared disk at any time). Cheap (one statvfs per file system); called at
        open, on every upkeep pass and when a write finds the disk full."""
        try:
            free_bytes = _free_bytes(self._dirs)
        except OSError as exc:  # a directory gone or unreadable: keep the last finding
            log.warning("ssd_free_space_unknown", error=str(exc))
            return
        room = max(0, self.used_bytes + free_bytes - self._reserve_bytes)
        capacity = min(self._configured_bytes, room)
        clamped, was_clamped = (
            capacity < self._configured_bytes,
            self._capacity_bytes < self._configured_bytes,
        )
        if clamped != was_clamped:  # one line per change, not one per refresh
            (log.warning if clamped else log.info)(
                "ssd_capacity_clamped" if clamped else "ssd_capacity_restored",
                configured_bytes=self._configured_bytes,
                capacity_bytes=capacity,
                free_bytes=free_bytes,
                used_bytes=self.used_bytes,
                reserve_bytes=self._reserve_bytes,
            )
        self._capacity_bytes = capacity

    # --- operations --------------------------------------------------------------------

    async def write(self, key: bytes, namespace: bytes, data: Buffer, borrower: str = "") -> None:
        """Publishes a serialized chunk atomically; a no-op if the key is stored already.
        `borrower`: the pool node it is held for, kept in the file's name.

        `data` must not change until this returns (the bytes are written from an I/O
        thread; if the caller is cancelled the write still completes in the background).
        """
        self._check_open()
        view = memoryview(data).cast("B")
        _check_chunk(key, namespace, view)
        while (busy := self._busy.get(key)) is not None:
            await asyncio.wait([busy])  # its outcome is not ours: just wait for the key to settle
        self._check_open()  # close() may have begun while we waited
        if key in self._index:
            return
        size = view.nbytes
        if self.used_bytes + size > self._capacity_bytes:
            raise SsdFullError(
                f"chunk {key.hex()} of {size} bytes does not fit: {self.used_bytes} bytes used "
                f"(in flight: {self._pending_bytes}) of {self._capacity_bytes}"
            )
        directory = self._dirs[self._next_dir]
        self._next_dir = (self._next_dir + 1) % len(self._dirs)
        pending = _PendingWrite(size)
        self._writing[key] = pending
        self._pending_bytes += size
        # shield: a cancelled caller must not leave a published file out of the index
        write = self._write_op(key, namespace, borrower, view, directory, pending)
        await asyncio.shield(self._start_op(key, write))

    async def store(self, chunk: Chunk, data: Buffer) -> None:
        await self.write(chunk.key, chunk.namespace, data, chunk.borrower)

    async def load(self, chunk: Chunk) -> bytearray:
        return await self.read(chunk.key)

    def discard(self, chunk: Chunk) -> asyncio.Future[None] | None:
        if self._state == "closed":  # a reader let go during shutdown: recovery finds the file
            return None
        unlinking = self._discard(chunk.key)
        return unlinking if isinstance(unlinking, asyncio.Task) else None

    async def read(self, key: bytes) -> bytearray:
        """The whole chunk, every layer verified; raises KeyError if not stored here and
        SsdChunkCorrupt (after dropping it) if the file is bad."""
        return await self._read_stored(key, self._read_chunk, (ChunkFormatError, ChunkCorruptError))

    async def read_header(self, key: bytes) -> ChunkLayout:
        """The chunk's parsed header, reading only its first bytes (layers are not verified)."""
        return await self._read_stored(key, self._read_layout, (ChunkFormatError,))

    async def _read_stored(
        self, key: bytes, read: Callable[[Path, bytes, int], _T], bad_file: tuple[type[Exception], ...]
    ) -> _T:
        """`read(path, key, size_bytes)` of the chunk's file, off the loop; KeyError if not
        stored here, SsdChunkCorrupt (after dropping it) if the file vanished or `read`
        raised one of `bad_file`."""
        self._check_open()
        entry = self._index[key]
        try:
            return await self._run(read, entry.path, key, entry.size_bytes)
        except FileNotFoundError:
            if self._index.get(key) is not entry:
                raise KeyError(key) from None  # delete() won the race: a plain miss
            await self._drop(key, entry, "file vanished")
        except bad_file as exc:
            await self._drop(key, entry, str(exc))
        except OSError as exc:
            raise SsdReadError(f"reading chunk {key.hex()} from SSD failed: {exc}") from exc

    async def delete(self, key: bytes) -> bool:
        """Removes the chunk; False if it was absent. A write in flight is cancelled: its
        file is removed as soon as it lands."""
        unlinking = self._discard(key)
        if isinstance(unlinking, asyncio.Task):
            await asyncio.shield(unlinking)
        return bool(unlinking)

    def _discard(self, key: bytes) -> asyncio.Task[None] | bool:
        """Forgets the chunk at once: the unlink that follows (returned), or for a write in
        flight whether this is its first delete; False if the key is absent."""
        self._check_open()
        pending = self._writing.get(key)
        if pending is not None:
            first = not pending.deleted
            pending.deleted = True
            return first
        entry = self._index.pop(key, None)
        if entry is None:
            return False
        self._published_bytes -= entry.size_bytes
        return self._start_op(key, self._run(_unlink_quietly, entry.path))

    # --- event-loop helpers ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "open":
            raise errors.FailedPrecondition(f"SSD tier is {self._state}, not open")

    async def _run(self, fn: Callable[..., _T], *args: object) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _start_op(self, key: bytes, op: Awaitable[None]) -> asyncio.Task[None]:
        """Runs one file operation on `key` as a task that outlives a cancelled caller."""

        async def run() -> None:
            try:
                await op
            finally:
                if self._busy.get(key) is task:
                    del self._busy[key]

        task = asyncio.ensure_future(run())
        self._busy[key] = task
        task.add_done_callback(_retrieve_exception)
        return task

    async def _write_op(
        self,
        key: bytes,
        namespace: bytes,
        borrower: str,
        view: memoryview,
        directory: Path,
        pending: _PendingWrite,
    ) -> None:
        try:
            try:
                path = await self._run(self._publish, directory, key, borrower, view)
            except OSError as exc:
                raise SsdWriteError(key, exc) from exc
            if pending.deleted:
                await self._run(_unlink_quietly, path)
                return
            self._index[key] = _Entry(path, pending.size_bytes, namespace, borrower)
            self._published_bytes += pending.size_bytes
        finally:
            self._pending_bytes -= pending.size_bytes
            del self._writing[key]

    async def _drop(self, key: bytes, entry: _Entry, reason: str) -> NoReturn:
        if self._index.get(key) is entry:  # not already deleted or replaced meanwhile
            del self._index[key]
            self._published_bytes -= entry.size_bytes
            self.corrupt_dropped += 1
            log.warning("ssd_chunk_dropped", key=key.hex(), reason=reason)
            await asyncio.shield(self._start_op(key, self._run(_unlink_quietly, entry.path)))
        raise SsdChunkCorrupt(key, reason)

    # --- I/O-thread helpers (blocking; never called on the event loop) ---------------------

    def _publish(self, directory: Path, key: bytes, borrower: str, data: memoryview) -> Path:
        """temp file, fsync, rename, fsync(dir): a reader never sees a partial chunk."""
        key_hex = key.hex()
        subdir = directory / "chunks" / key_hex[:2]
        final = subdir / _chunk_file_name(key_hex, borrower)
        tmp = subdir / f"{key_hex}.{secrets.token_hex(8)}{_TMP_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                self._write_file(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        try:
            fsync_directory(subdir)  # makes the rename itself durable
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(final)
            raise
        return final

    def _write_file(self, fd: int, data: memoryview) -> None:
        done = 0
        while done < data.nbytes:  # os.write may write less than asked
            done += os.write(fd, data[done:])

    def _read_file(self, path: Path) -> bytearray:
        """The whole file in one preallocated buffer (shorter if it shrank meanwhile)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            data = bytearray(size)
            view = memoryview(data)
            done = 0
            while done < size:
                n = os.preadv(fd, [view[done:]], done)
                if n == 0:
                    break
                done += n
        finally:
            os.close(fd)
        return data if done == size else data[:done]

    def _read_chunk(self, path: Path, key: bytes, expected_bytes: int) -> bytearray:
        data = self._read_file(path)
        layout = decode_layout(data)
        _check_layout(layout, key, len(data), expected_bytes)
        verify_layers(data, layout, 0, layout.header.num_layers)
        return data

    def _read_layout(self, path: Path, key: bytes, expected_bytes: int | None) -> ChunkLayout:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, _HEADER_PROBE_BYTES, 0)
            needed = header_bytes_needed(head)
            if needed > len(head):
                head = os.pread(fd, needed, 0)
        finally:
            os.close(fd)
        layout = decode_layout(head)
        _check_layout(layout, key, size, expected_bytes)
        return layout

    def _scan_dir(self, directory: Path) -> tuple[list[tuple[bytes, _Entry]], int]:
        """Recovery of one directory: removes temp files and chunks whose header is bad."""
        chunks = directory / "chunks"
        chunks.mkdir(parents=True, exist_ok=True)
        for prefix in range(256):  # made once here so the write path never needs mkdir
            (chunks / f"{prefix:02x}").mkdir(exist_ok=True)
        fsync_directory(chunks)
        fsync_directory(directory)
        found: list[tuple[bytes, _Entry]] = []
        dropped = 0
        for subdir in sorted(chunks.iterdir()):
            if not subdir.is_dir():
                continue
            for item in os.scandir(subdir):
                path = Path(item.path)
                if item.name.endswith(_TMP_SUFFIX):  # an interrupted write
                    _unlink_quietly(path)
                    continue
                if not item.name.endswith(_CHUNK_SUFFIX):
                    continue  # not ours: leave it alone
                try:
                    key, borrower = _parse_file_name(path)
                    layout = self._read_layout(path, key, None)
                except (ChunkFormatError, OSError) as exc:
                    log.warning("ssd_recovery_drop", path=str(path), reason=str(exc))
                    _unlink_quietly(path)
                    dropped += 1
                    continue
                found.append((key, _Entry(path, layout.total_bytes, layout.header.namespace, borrower)))
        return found, dropped


def _check_chunk(key: bytes, namespace: bytes, view: memoryview) -> None:
    """Refuses bytes that recovery would later drop: bad header, wrong key, namespace or size."""
    if len(key) != KEY_BYTES:
        raise errors.InvalidArgument(f"chunk key must be {KEY_BYTES} bytes, got {len(key)}")
    try:
        layout = decode_layout(view)
    except ChunkFormatError as exc:
        raise errors.InvalidArgument(f"chunk {key.hex()}: {exc}") from exc
    if layout.header.key != key or layout.header.namespace != namespace:
        raise errors.InvalidArgument(f"chunk {key.hex()}: header names another key or namespace")
    if layout.total_bytes != view.nbytes:
        raise errors.InvalidArgument(
            f"chunk {key.hex()} is {view.nbytes} bytes, its header says {layout.total_bytes}"
        )


def _check_layout(layout: ChunkLayout, key: bytes, file_bytes: int, expected_bytes: int | None) -> None:
    if layout.header.key != key:
        raise ChunkFormatError("header key differs from the file name")
    if file_bytes != layout.total_bytes:
        raise ChunkFormatError(f"file is {file_bytes} bytes, its header says {layout.total_bytes}")
    if expected_bytes is not None and file_bytes != expected_bytes:
        raise ChunkFormatError(f"file is {file_bytes} bytes, the index says {expected_bytes}")


def _chunk_file_name(key_hex: str, borrower: str) -> str:
    if not borrower:
        return f"{key_hex}{_CHUNK_SUFFIX}"
    mark = base64.urlsafe_b64encode(borrower.encode()).decode().rstrip("=")
    return f"{key_hex}{_BORROWER_MARK}{mark}{_CHUNK_SUFFIX}"


def _parse_file_name(path: Path) -> tuple[bytes, str]:
    """The key and borrower a published chunk's file name gives (ChunkFormatError if none)."""
    key_hex, _, mark = path.name.removesuffix(_CHUNK_SUFFIX).partition(_BORROWER_MARK)
    try:
        key = bytes.fromhex(key_hex)
        borrower = base64.urlsafe_b64decode(mark + "=" * (-len(mark) % 4)).decode()
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
        raise ChunkFormatError("file name is not a chunk key (and borrower)") from None
    if len(key) != KEY_BYTES or key.hex() != key_hex or path.parent.name != key_hex[:2]:
        raise ChunkFormatError("file name is not a chunk key in its prefix folder")
    if _chunk_file_name(key_hex, borrower) != path.name:
        raise ChunkFormatError("file name's borrower mark is not canonical")
    return key, borrower


def _free_bytes(dirs: Sequence[Path]) -> int:
    """Bytes available to us on the file systems of `dirs`, each file system counted once."""
    free: dict[int, int] = {}
    for directory in dirs:
        stat = os.statvfs(directory)
        free[os.stat(directory).st_dev] = stat.f_bavail * stat.f_frsize
    return sum(free.values())


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:  # the index no longer names it; recovery may find it again
        log.warning("ssd_unlink_failed", path=str(path), error=str(exc))


def _retrieve_exception(task: asyncio.Task[None]) -> None:
    # Callers that were cancelled never see the outcome; mark it seen to avoid a log storm.
    if not task.cancelled():
        task.exception()
