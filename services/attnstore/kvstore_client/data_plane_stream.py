"""One data-plane connection on the client's event loop (attnstore/data_plane_wire.py).

A BufferedProtocol: the kernel copies a reply frame into a buffer of exactly its size
and the payload that follows straight into the caller's buffers, with no thread in
between. The first client ran every transfer in a worker thread: the hop from the loop
and back cost about 120 us of CPU per 0.5 MB read on the shared 2-core machine (330 vs
210 us a read with and without it, load 9), more than the daemon spent serving it.

    IDLE (reading paused) ─exchange─> FRAME (prefix, then body) ─ok reply + place─> PAYLOAD ─> IDLE
                                          └─ reply without place ─> IDLE ─recv_into─> PAYLOAD
    any state ─bytes nobody asked for, a disconnect─> CLOSED (the waiter gets the error)

A connection that failed, was cancelled or timed out mid-exchange is aborted, never
reused: the stream cannot be resynchronised.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from attnstore.data_plane_wire import (
    PREFIX_BYTES,
    ConnectionClosed,
    decode_frame,
    frame_length,
    raise_for_reply,
)
from attnstore.kvstore_client.pieces import DaemonProtocolError

PlaceStream = Callable[[list[bytes]], Sequence[memoryview]]  # chunk headers -> buffers of the stream


class PlaneConnection(asyncio.BufferedProtocol):
    def __init__(self, max_frame_bytes: int) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._transport: asyncio.Transport | None = None
        self._prefix = bytearray(PREFIX_BYTES)
        self._body: bytearray | None = None
        self._filled = 0  # bytes of the prefix or body received
        self._views: deque[memoryview] = deque()  # payload destinations still to fill, in order
        self._place: PlaceStream | None = None  # the exchange's, called on its ok reply
        self._waiter: asyncio.Future[dict[str, Any]] | None = None
        self._reply: dict[str, Any] = {}

    @property
    def open(self) -> bool:
        return self._transport is not None

    # ---- the caller's side -------------------------------------------------------------

    async def exchange(
        self, frame: bytes, payload: Sequence[memoryview] = (), place: PlaceStream | None = None
    ) -> dict[str, Any]:
        """Sends `frame` then `payload`; returns the ok reply (a refusal raises the error it
        names). With `place`, the payload that follows the reply fills the buffers
        `place(headers)` answers (called on the loop) before this returns."""
        self._place = place
        self._transport_or_raise().writelines([frame, *payload])
        return await self._wait()

    async def recv_into(self, views: Sequence[memoryview]) -> None:
        """Fills `views` in order with the next bytes of the stream."""
        self._views.extend(v.cast("B") for v in views if v.nbytes)
        if self._views:
            await self._wait()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
            self._transport = None

    def _transport_or_raise(self) -> asyncio.Transport:
        if self._transport is None:
            raise ConnectionClosed("the data-plane connection is closed")
        return self._transport

    async def _wait(self) -> dict[str, Any]:
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport_or_raise().resume_reading()
        try:
            return await self._waiter
        finally:
            self._waiter = None

    # ---- transport events --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport
        self._transport.pause_reading()  # IDLE

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._views:
            return self._views[0]
        if self._body is not None:
            return memoryview(self._body)[self._filled :]
        return memoryview(self._prefix)[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._views:
                self._received_payload(nbytes)
            else:
                self._received_frame_bytes(nbytes)
        except Exception as exc:  # noqa: BLE001 -- handed to the waiter, which raises it
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fail(ConnectionClosed("the peer closed the data-plane connection mid-transfer"))

    # ---- the stream ---------------------------------------------------------------------

    def _received_payload(self, nbytes: int) -> None:
        view = self._views[0]
        if nbytes == view.nbytes:
            self._views.popleft()
        else:
            self._views[0] = view[nbytes:]
        if not self._views:
            self._done(self._reply)

    def _received_frame_bytes(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._body is None:
            if self._filled < PREFIX_BYTES:
                return
            self._body, self._filled = bytearray(frame_length(self._prefix, self._max_frame_bytes)), 0
        if self._filled < len(self._body):
            return
        body, self._body, self._filled = self._body, None, 0
        if self._waiter is None:
            raise DaemonProtocolError("the data plane sent a frame nobody asked for")
        self._reply = raise_for_reply(decode_frame(body))
        place, self._place = self._place, None
        if place is not None:
            headers = self._reply.get("headers")
            if not isinstance(headers, list):
                raise DaemonProtocolError("the data plane's reply lacks the chunk headers")
            self._views.extend(v.cast("B") for v in place(headers) if v.nbytes)
        if not self._views:
            self._done(self._reply)

    def _done(self, reply: dict[str, Any]) -> None:
        if self._transport is not None:
            self._transport.pause_reading()  # IDLE: nothing is read that nobody asked for
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(reply)

    def _fail(self, exc: Exception) -> None:
        self.abort()
        self._views.clear()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
