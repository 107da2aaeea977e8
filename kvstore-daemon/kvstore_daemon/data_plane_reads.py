"""Unheld reads of DRAM chunks answered without Python (data_plane_reads.c, through ctypes).

Where a 0.5 MB Get went on the Python path (load 6-8, 2 cores): ~45 us of the daemon's
Python around one `sendmsg`, and the thread's wake-ups to take the GIL; 1.2x Redis GET
needs ~170 us a read. Here a connection's thread calls `serve_frames`, which stays in C
(GIL released) while the peer asks for chunks the table holds, and returns the first frame
Python must answer: a read of a chunk not in the table, a held read, a put, anything
malformed (parsed again by Python, so every refusal is the Python path's).

A chunk enters the table when it is committed to DRAM or promoted there (`register`: its
extents, blocks and versions, header and layer offsets), or when the Python path sent it
unheld (a chunk promoted before it was ever parsed); it leaves before its blocks are freed
(`forget`). The C side trusts an entry only while the blocks keep those versions, and
drops it when they do not (data_plane_reads.c says how that is safe). Reads served in C
are noted on the event loop in batches, as the Python path's unheld reads are
(`take_reads`).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import socket
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnstore.c_build import load_probed
from attnstore.data_plane_wire import ConnectionClosed, decode_frame, frame_length
from attnstore.shm_arena import seqlock_reads_supported
from kvstore_daemon.chunk_store import UnheldCopy
from kvstore_daemon.dram_tier import DramTier

SOURCE = Path(__file__).with_name("data_plane_reads.c")
UNAVAILABLE_VARIABLE = "ATTNSTORE_DATA_PLANE_C_READS_UNAVAILABLE"
_READS_BUFFER_BYTES = 1 << 20  # served reads' (namespace, key) records between two notes
_SERVE_CLOSED, _SERVE_FRAME, _SERVE_TOO_LONG, _SERVE_CLOSING = 0, 1, 2, 3

_u32p = ctypes.POINTER(ctypes.c_uint32)
_u64p = ctypes.POINTER(ctypes.c_uint64)


def _wrap(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.dpr_open.restype = ctypes.c_void_p
    lib.dpr_open.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64,
                             ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint64]  # fmt: skip
    lib.dpr_register.restype = ctypes.c_int
    lib.dpr_register.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint32,
                                 ctypes.c_uint64, _u64p, ctypes.c_uint32, _u32p, _u64p, ctypes.c_uint32,
                                 _u64p, ctypes.c_uint32]  # fmt: skip
    lib.dpr_forget.restype = None
    lib.dpr_forget.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint32,
                               ctypes.c_uint64]  # fmt: skip
    lib.dpr_take_reads.restype = ctypes.c_uint64
    lib.dpr_take_reads.argtypes = [ctypes.c_void_p, ctypes.c_void_p, _u64p, _u64p, _u64p]
    lib.dpr_close.restype = None
    lib.dpr_close.argtypes = [ctypes.c_void_p]
    lib.dpr_serve.restype = ctypes.c_int
    lib.dpr_serve.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_uint32,
        _u32p,
    ]
    return lib


def _probe(lib: ctypes.CDLL) -> str | None:
    return None if hasattr(lib, "dpr_serve") else "dpr_serve missing"


def _address(view: memoryview) -> int:
    """The address of a writable view's first byte, with no export left behind (the arena
    must stay closable)."""
    holder = ctypes.c_char.from_buffer(view)
    address = ctypes.addressof(holder)
    del holder
    return address


def _array(kind: type, values: Sequence[int]) -> ctypes.Array:  # type: ignore[type-arg]
    return (kind * max(1, len(values)))(*values)


@dataclass(frozen=True)
class TakenReads:
    """Reads C served between two drains."""

    valid: dict[bytes, list[bytes]]  # keys by namespace, one entry per chunk sent valid
    bytes_sent: int
    chunks_sent: int  # valid or not
    not_recorded: int  # valid reads lost to a full record buffer


class CReads:
    """The C table of registered DRAM chunks and the serve loop over it."""

    def __init__(
        self, lib: ctypes.CDLL, dram: DramTier, capacity: int, max_keys: int, max_frame_bytes: int
    ) -> None:
        self._lib = lib
        self._frames = _FrameBuffers(max_frame_bytes)
        self.wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        base = _address(dram.arena.view)
        num_blocks = dram.capacity_bytes // dram.block_bytes
        handle = lib.dpr_open(base, dram.capacity_bytes, base + dram.versions_offset_bytes, num_blocks,
                              capacity, max_keys, self.wake_fd, _READS_BUFFER_BYTES)  # fmt: skip
        if not handle:
            os.close(self.wake_fd)
            raise MemoryError("the data plane's C read table could not be allocated")
        self._handle = handle
        self._reads = bytearray(_READS_BUFFER_BYTES)
        self._reads_address = _address(memoryview(self._reads))

    def register(self, namespace: bytes, key: bytes, copy: UnheldCopy) -> None:
        """Lets C serve `key` from where `copy` says it lays (committed or promoted to DRAM,
        or sent valid by the Python path); a chunk beyond the table's limits stays on the
        Python path. ~25 us on the loop for a 30-layer chunk (60 before `layer_offsets`)."""
        layout = copy.layout
        layers = layout.header.num_layers
        offsets = layout.layer_offsets()
        extents = [value for extent in copy.extents for value in extent]
        self._lib.dpr_register(
            self._handle, namespace, len(namespace), key, len(key), layout.data_offset,
            _array(ctypes.c_uint64, extents), len(copy.extents),
            _array(ctypes.c_uint32, copy.blocks), _array(ctypes.c_uint64, copy.versions), len(copy.blocks),
            _array(ctypes.c_uint64, offsets), layers,
        )  # fmt: skip

    def forget(self, namespace: bytes, key: bytes, first_block: int) -> None:
        """Drops `key`'s entry if it names the DRAM copy starting at `first_block` (about to
        be freed)."""
        self._lib.dpr_forget(self._handle, namespace, len(namespace), key, len(key), first_block)

    def serve_frames(self, sock: socket.socket, timeout_seconds: float) -> dict[str, Any]:
        """Answers the reads C can on `sock` (a plain socket after its hello); returns the
        first request Python must answer, decoded. Raises as `recv_frame` does for a frame
        too long or not msgpack, a peer gone (ConnectionClosed), a stall (TimeoutError)."""
        frame = self._frames.buffer
        length = ctypes.c_uint32(0)
        status = self._lib.dpr_serve(
            self._handle, sock.fileno(), max(1, int(timeout_seconds * 1000)),
            _address(frame), len(frame), ctypes.byref(length),
        )  # fmt: skip
        if status == _SERVE_FRAME:
            return decode_frame(frame[: length.value])
        if status == _SERVE_TOO_LONG:
            frame_length(length.value, len(frame))  # raises its FrameError
        if status in (_SERVE_CLOSED, _SERVE_CLOSING) or status == -1:
            raise ConnectionClosed("the peer closed the data-plane connection")
        if status == -errno.ETIMEDOUT:
            raise TimeoutError("the data-plane connection stalled")
        raise OSError(-status, os.strerror(-status))

    def take_reads(self) -> TakenReads:
        """What C served since the last call."""
        sent, chunks, dropped = ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_uint64(0)
        length = self._lib.dpr_take_reads(
            self._handle, self._reads_address, ctypes.byref(sent), ctypes.byref(chunks), ctypes.byref(dropped)
        )
        reads: dict[bytes, list[bytes]] = defaultdict(list)
        records, at = memoryview(self._reads)[:length], 0
        while at < length:
            namespace = bytes(records[at + 1 : at + 1 + records[at]])
            at += 1 + records[at]
            reads[namespace].append(bytes(records[at + 1 : at + 1 + records[at]]))
            at += 1 + records[at]
        return TakenReads(reads, sent.value, chunks.value, dropped.value)

    def close(self) -> None:
        """Waits until no C serve is inside the arena and drops every entry (the arena may
        then be unmapped); later serves answer nothing and close their connections."""
        self._lib.dpr_close(self._handle)
        os.close(self.wake_fd)


class _FrameBuffers(threading.local):
    """Each connection thread's buffer for request frames: an anonymous mapping, so only
    the pages a frame touches take memory (requests are a few hundred bytes; the limit is
    data_plane_max_frame_bytes)."""

    def __init__(self, size_bytes: int) -> None:
        self.buffer = mmap.mmap(-1, size_bytes)


def open_c_reads(
    dram: DramTier, capacity: int, max_keys: int, max_frame_bytes: int
) -> tuple[CReads | None, str | None]:
    """The C read path, or None and why not (seqlock reads unsupported on this CPU, no
    compiler, a failed build, `ATTNSTORE_DATA_PLANE_C_READS_UNAVAILABLE=1`)."""
    if not seqlock_reads_supported():
        return None, "seqlock reads need x86-64"
    lib, error = load_probed(SOURCE, UNAVAILABLE_VARIABLE, _wrap, _probe)
    if lib is None:
        return None, error
    return CReads(lib, dram, capacity, max_keys, max_frame_bytes), None
