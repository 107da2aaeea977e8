"""A data-plane connection read from the event loop without a trip to a thread.

Every receive is tried at once on the non-blocking socket, and the read waits on the loop
only when the kernel has nothing yet: on a loopback the daemon's answer is mostly in the
socket by the time the request's `send` returns, so a whole read usually waits for
nothing. Hence no coroutine per receive (`loop.sock_recv_into` is one) and no timer unless
a call waits (`asyncio.timeout` cost 9 us a read at load 5). Small frames come through a
small buffer, one receive for a frame and the bytes behind it; a payload goes straight
into the reader's views by scatter receives, with the buffer after the last view, so the
frame that follows the payload (an unheld read's trailer) comes in the same receive.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Any, Self

from attnstore.data_plane_wire import (
    LENGTH,
    MAX_IOVECS,
    ConnectionClosed,
    advance,
    decode_frame,
    frame_length,
)

_BUFFER_BYTES = 8192  # a one-chunk reply (the chunk's 4,096-byte header region) and more


class LoopStream:
    """One request and its answer on a plain socket, from the event loop; `timeout_seconds`
    bounds them all together. The socket is non-blocking while the stream is used."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, timeout_seconds: float) -> None:
        self._loop = loop
        self._sock = sock
        self._deadline = loop.time() + timeout_seconds
        self._buffer = bytearray(_BUFFER_BYTES)
        self._start = self._end = 0  # the received bytes not yet taken: _buffer[_start:_end]
        self._deadline_timer: asyncio.TimerHandle | None = None  # armed at the first wait
        self._waiting: asyncio.Future[None] | None = None
        sock.setblocking(False)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()

    @property
    def drained(self) -> bool:
        """Whether every byte received has been taken (the daemon sent nothing more)."""
        return self._start == self._end

    async def send(self, data: bytes) -> None:
        try:
            sent = self._sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):  # the socket's buffer is full: a request is rarely this long
            async with asyncio.timeout_at(self._deadline):
                await self._loop.sock_sendall(self._sock, memoryview(data)[sent:])

    async def frame(self, max_bytes: int) -> dict[str, Any]:
        """The next frame's map (FrameError as `recv_frame`)."""
        if self._start:  # the frame starts the buffer: the longest frame that fits does
            remaining = self._end - self._start
            self._buffer[:remaining] = self._buffer[self._start : self._end]
            self._start, self._end = 0, remaining
        while self._end < LENGTH.size:
            await self._receive()
        length = frame_length(LENGTH.unpack_from(self._buffer)[0], max_bytes)
        end = LENGTH.size + length
        if end > len(self._buffer):  # longer than the buffer (a reply for several chunks)
            body = bytearray(length)
            self._start = LENGTH.size
            await self.fill(self.take_buffered([memoryview(body)]))
            return decode_frame(body)
        while self._end < end:
            await self._receive()
        self._start = end
        return decode_frame(memoryview(self._buffer)[LENGTH.size : end])

    def take_buffered(self, views: Sequence[memoryview]) -> list[memoryview]:
        """Copies the bytes already received into the front of `views`; the rest of them."""
        pending = [view.cast("B") for view in views if view.nbytes]
        while pending and self._start < self._end:
            size = min(pending[0].nbytes, self._end - self._start)
            pending[0][:size] = self._buffer[self._start : self._start + size]
            self._start += size
            advance(pending, size)
        return pending

    async def fill(self, views: list[memoryview]) -> None:
        """Fills `views` (byte views; nothing buffered may precede them: `take_buffered`) in
        order straight from the socket; what the daemon sent after them stays buffered."""
        if views:
            self._start = self._end = 0
        while views:
            batch = views[:MAX_IOVECS - 1]  # fmt: skip
            expected = sum(view.nbytes for view in batch)
            tail = [memoryview(self._buffer)] if len(batch) == len(views) else []
            try:
                received = self._sock.recvmsg_into(batch + tail)[0]
            except BlockingIOError:
                await self._readable()
                continue
            if received == 0:
                raise ConnectionClosed("the peer closed the data-plane connection mid-transfer")
            if received > expected:
                self._end = received - expected
                views.clear()
            else:
                advance(views, received)

    async def _receive(self) -> None:
        """Appends what the socket has to the buffer, waiting for it if need be."""
        while True:
            try:
                received = self._sock.recv_into(memoryview(self._buffer)[self._end :])
            except BlockingIOError:
                await self._readable()
                continue
            if received == 0:
                raise ConnectionClosed("the peer closed the data-plane connection mid-transfer")
            self._end += received
            return

    async def _readable(self) -> None:
        """Waits until the socket has bytes (TimeoutError past the deadline). One timer for
        the whole stream, not one a wait: a 2 MB read waits a dozen times, and a timer a
        wait (`asyncio.timeout_at`) took its CPU from 376 to 440 us (median of 6 A/B
        rounds, load 13)."""
        if self._loop.time() >= self._deadline:
            raise TimeoutError("the data-plane read timed out")
        if self._deadline_timer is None:
            self._deadline_timer = self._loop.call_at(self._deadline, self._expire)
        self._waiting = self._loop.create_future()
        fd = self._sock.fileno()
        self._loop.add_reader(fd, _set_ready, self._waiting)
        try:
            await self._waiting
        finally:
            self._waiting = None
            self._loop.remove_reader(fd)

    def _expire(self) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_exception(TimeoutError("the data-plane read timed out"))


def _set_ready(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
