"""One data-plane connection: a protocol on the daemon's event loop.

    HELLO ─hello─> READY ─get─> SENDING (chunks held until the kernel took every byte) ─> READY
                     └───put─> RECEIVING (payload bytes into the reservations) ─────────> READY
    any state ─garbage, a refusal, idle past the timeout, a disconnect─> CLOSED (held chunks given back)

Bytes arrive in a per-connection scratch buffer (BufferedProtocol: no allocation per
read). Frames are parsed from there; payload bytes are copied straight into their
reservation (one copy, on the loop: a reservation that expires meanwhile frees its
blocks, so nothing may write into them later). A get's chunks go out in one gather
write of arena views, held until the transport's buffer is empty (the write-buffer limit
is 0, so `resume_writing` says when). One request at a time: reading pauses while one
is served, and a client never pipelines.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attnstore import errors
from attnstore.data_plane_wire import (
    PREFIX_BYTES,
    FrameError,
    decode_frame,
    error_frame,
    field,
    frame_length,
    pack_frame,
)
from kvstore_daemon import metrics
from kvstore_daemon.chunk_entry import Chunk
from kvstore_daemon.validation import check_keys, check_layer_range, check_namespace

if TYPE_CHECKING:
    from kvstore_daemon.data_plane import DataPlaneServer

_SCRATCH_BYTES = 256 * 1024  # one receive's most; a put's payload streams through it
_OK = pack_frame({"ok": True})
_BYTES_OUT = metrics.BYTES_OUT.labels("dataplane")
_BYTES_IN = metrics.BYTES_IN.labels("dataplane")


class DataPlaneConnection(asyncio.BufferedProtocol):
    def __init__(self, server: DataPlaneServer) -> None:
        self._server = server
        self._store = server.store
        settings = server.settings
        self._max_frame_bytes = settings.data_plane_max_frame_bytes
        self._idle_seconds = settings.data_plane_idle_timeout_seconds
        self._max_keys = settings.max_keys_per_request
        self._loop = asyncio.get_running_loop()
        self._scratch = memoryview(bytearray(_SCRATCH_BYTES))
        self._inbox = bytearray()  # received bytes not parsed yet
        self._transport: asyncio.Transport | None = None
        self._greeted = False
        self._busy = False  # a request is being served: nothing more is parsed
        self._payload: deque[list[int]] = deque()  # a put's [write id, offset, size] still due
        self._payload_bytes = 0
        self._held: tuple[Sequence[Chunk], int | None] | None = None  # a get's chunks until sent
        self._task: asyncio.Task[None] | None = None
        self._last_active = self._loop.time()
        self._idle_timer: asyncio.TimerHandle | None = None

    # ---- transport events -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's are not asyncio.Transport)
        if not self._server.admit(self):
            transport.abort()
            return
        transport.set_write_buffer_limits(high=0)  # pause_writing whenever a send is not all out
        self._idle_timer = self._loop.call_later(self._idle_seconds, self._check_idle)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        self._last_active = self._loop.time()
        data = self._scratch[:nbytes]
        try:
            if self._payload:
                data = self._receive_payload(data)
            self._inbox += data
            self._serve_inbox()
        except errors.ServiceError as exc:
            self._refuse(exc)

    def resume_writing(self) -> None:
        """Every byte of the last send is in the kernel: its chunks may go."""
        self._last_active = self._loop.time()
        self._unhold()
        self._request_done()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._task is not None:
            self._task.cancel()  # a hold still promoting gives its chunks back itself
        self._unhold()
        self._transport = None

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # ---- requests -------------------------------------------------------------------

    def _serve_inbox(self) -> None:
        """Serves every complete frame received (and the payload that follows a put)."""
        while not self._busy and self._transport is not None and len(self._inbox) >= PREFIX_BYTES:
            end = PREFIX_BYTES + frame_length(self._inbox[:PREFIX_BYTES], self._max_frame_bytes)
            if len(self._inbox) < end:
                return
            request = decode_frame(bytes(self._inbox[PREFIX_BYTES:end]))
            del self._inbox[:end]
            self._dispatch(request)
            if self._payload and self._inbox:  # payload bytes that came with the frame
                rest = self._receive_payload(memoryview(bytes(self._inbox)))
                self._inbox = bytearray(rest)

    def _dispatch(self, request: dict[str, Any]) -> None:
        op = field(request, "op", str)
        if not self._greeted:
            if op != "hello":
                raise FrameError("the first frame must be a hello")
            if not self._server.token_accepted(request.get("token")):
                raise errors.Unauthenticated("the data plane needs a valid internal token")
            self._greeted = True
            self._write(_OK)
        elif op == "get":
            self._start_get(request)
        elif op == "put":
            self._start_put(request)
        else:
            raise FrameError(f"unknown op {op!r}")

    def _start_get(self, request: dict[str, Any]) -> None:
        """Chunks named by `keys` (held for the send, as gRPC's Get does: one round trip),
        or chunks `chunks` of a lease granted by GetShm (ended after with `release`)."""
        namespace = check_namespace(field(request, "namespace", bytes))
        layers = (field(request, "layer_start", int), field(request, "layer_end", int))
        assert self._transport is not None
        self._busy = True
        self._transport.pause_reading()
        if "keys" in request:
            keys = field(request, "keys", list)
            if not 0 < len(keys) <= self._max_keys or not all(isinstance(key, bytes) for key in keys):
                raise FrameError(f"keys must list 1..{self._max_keys} keys (bytes)")
            keys = check_keys(keys, self._max_keys, unique=True)
            self._task = self._loop.create_task(self._get_keys(namespace, keys, layers))
            return
        lease_id = field(request, "lease", int)
        indices = field(request, "chunks", list)
        if not 0 < len(indices) <= self._max_keys or not all(type(i) is int for i in indices):
            raise FrameError(f"chunks must list 1..{self._max_keys} chunk indices")
        release_id = lease_id if request.get("release") is True else None
        self._send(self._store.hold_leased(namespace, lease_id, indices), release_id, layers)

    async def _get_keys(self, namespace: bytes, keys: list[bytes], layers: tuple[int, int]) -> None:
        try:
            chunks = await self._store.hold_keys(namespace, keys)
        except errors.ServiceError as exc:
            self._refuse(exc)
            return
        finally:
            self._task = None
        if self._transport is None:  # the reader left while the chunks were promoted
            self._store.unhold(chunks, None)
            return
        try:
            self._send(chunks, None, layers)
        except errors.ServiceError as exc:
            self._refuse(exc)

    def _send(self, chunks: Sequence[Chunk], release_id: int | None, layers: tuple[int, int]) -> None:
        """One gather write, layer-major (the reader may start on layer 0): the reply frame
        with the headers, then every layer's views."""
        self._held = (chunks, release_id)
        num_layers = chunks[0].layout.header.num_layers  # type: ignore[union-attr]  # one namespace: one count
        start, end = check_layer_range(*layers, num_layers)
        reply = pack_frame({"ok": True, "headers": [self._store.header_bytes(c) for c in chunks]})
        views = [
            view
            for layer in range(start, end)
            for chunk in chunks
            for view in self._store.layer_views(chunk, layer, layer + 1)
        ]
        assert self._transport is not None
        self._transport.writelines([reply, *views])
        _BYTES_OUT.inc(sum(v.nbytes for v in views))
        if not self._transport.get_write_buffer_size():  # else resume_writing ends it
            self._unhold()
            self._request_done()

    def _start_put(self, request: dict[str, Any]) -> None:
        namespace = check_namespace(field(request, "namespace", bytes))
        writes = _write_list(field(request, "writes", list), self._max_keys)
        self._store.check_streamed_writes(namespace, writes)
        self._payload = deque([write_id, 0, size] for write_id, size in writes)
        self._payload_bytes = sum(size for _, size in writes)

    def _receive_payload(self, data: memoryview) -> memoryview:
        """Copies `data` into the reservations due; returns what is left past the payload."""
        while data and self._payload:
            due = self._payload[0]
            write_id, offset, size = due
            taken = min(size - offset, data.nbytes)
            self._store.write(write_id, offset, data[:taken])
            data = data[taken:]
            due[1] += taken
            if due[1] == size:
                self._payload.popleft()
        if not self._payload:
            _BYTES_IN.inc(self._payload_bytes)
            self._write(pack_frame({"ok": True, "bytes_written": self._payload_bytes}))
        return data

    # ---- endings ----------------------------------------------------------------------

    def _request_done(self) -> None:
        if self._busy and self._held is None and self._task is None and self._transport is not None:
            self._busy = False
            self._transport.resume_reading()
            try:
                self._serve_inbox()
            except errors.ServiceError as exc:
                self._refuse(exc)

    def _unhold(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._store.unhold(*held)

    def _write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def _refuse(self, exc: errors.ServiceError) -> None:
        """Answers the refusal (a closed peer hears nothing) and closes: a stream cannot be
        resynchronised once a payload may be in flight."""
        if self._transport is None:
            return
        self._unhold()
        if not isinstance(exc, errors.Unavailable):
            self._transport.write(pack_frame(error_frame(exc)))
        self._transport.close()
        self._transport = None

    def _check_idle(self) -> None:
        if self._transport is None:
            return
        idle = self._loop.time() - self._last_active
        if idle >= self._idle_seconds:  # a stalled peer: cut, as a socket timeout would
            self._transport.abort()
            return
        self._idle_timer = self._loop.call_later(self._idle_seconds - idle, self._check_idle)


def _write_list(raw: Sequence[Any], max_writes: int) -> list[tuple[int, int]]:
    if not 0 < len(raw) <= max_writes:
        raise FrameError(f"writes must list 1..{max_writes} [write_id, bytes] pairs")
    writes = []
    for item in raw:
        if not (
            isinstance(item, list) and len(item) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in item)
        ):
            raise FrameError("each write must be [write_id, bytes], positive integers")
        writes.append((item[0], item[1]))
    if len({write_id for write_id, _ in writes}) != len(writes):
        raise FrameError("a write id is named twice")
    return writes
