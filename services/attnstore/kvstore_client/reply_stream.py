"""A whole data-plane read's reply, payload and trailer in as few receives as possible.

They come back to back on the stream (the daemon sends the first two in one gather
write). Every receive is a trip through Python; on the event loop one that finds nothing
yet is a wait (a selector wake-up and a task step), and in a thread with a timeout each
is a poll and a receive, and a release and retake of the GIL (which, among 16 reader
threads, waits for the others). So: the reply is taken with whatever payload came with it
into a small scratch buffer in one receive (not one for its length and one for its body),
the payload bytes that came along are copied to the reader's buffers, and the rest of the
payload is received straight into them by `recvmsg_into` with the scratch buffer last, so
the trailer lands in the same receive as the payload's end: two receives a read where
there were five.

`_Steps` parses without I/O (its generators yield the buffers to receive into and are
sent the count received); `LoopStream` drives it on the event loop from a non-blocking
socket, `BlockingStream` in the calling thread.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Generator, Sequence
from typing import Any

from attnstore.data_plane_wire import MAX_IOVECS, ConnectionClosed, advance, decode_frame, frame_length

_LENGTH = struct.Struct("!I")
# A one-chunk reply is its 4 KiB header and a few bytes: what else the first receive brings
# is payload, copied out once; a reply longer than this (many chunks) gets its own buffer.
SCRATCH_BYTES = 8 * 1024
Steps = Generator[list[memoryview], int, Any]  # yields buffers to fill in order, is sent the bytes received


class _Steps:
    """Frames and payload parsed from what was received, through `scratch`."""

    def __init__(self, scratch: bytearray) -> None:
        self._scratch = memoryview(scratch)
        self._start = self._end = 0  # scratch[start:end]: received, not yet consumed

    def _frame(self, max_bytes: int) -> Steps:
        """The next frame (FrameError past `max_bytes`, as `recv_frame`)."""
        self._compact()
        while self._end < _LENGTH.size:
            self._end += yield [self._scratch[self._end :]]
        length = frame_length(_LENGTH.unpack_from(self._scratch)[0], max_bytes)
        frame_end = _LENGTH.size + length
        if frame_end > len(self._scratch):  # a long reply (many headers): its own buffer
            body = bytearray(length)
            have = self._end - _LENGTH.size
            body[:have] = self._scratch[_LENGTH.size : self._end]
            self._start = self._end = 0
            yield from self._fill([memoryview(body)[have:]])
            return decode_frame(body)
        while self._end < frame_end:
            self._end += yield [self._scratch[self._end :]]
        self._start = frame_end
        return decode_frame(self._scratch[_LENGTH.size : frame_end])

    def _fill(self, views: Sequence[memoryview]) -> Steps:
        """Fills `views` in order: first from bytes already received, then from the socket,
        whatever follows the last view landing in the scratch buffer."""
        pending = self.drain_into(views)
        while pending:
            batch = pending[:MAX_IOVECS]
            wanted = sum(view.nbytes for view in batch)
            tail = [self._scratch] if len(batch) == len(pending) and len(batch) < MAX_IOVECS else []
            received = yield batch + tail
            self._end = max(0, received - wanted)
            advance(pending, received - self._end)

    def drain_into(self, views: Sequence[memoryview]) -> list[memoryview]:
        """Copies the bytes received and not consumed into `views`; the parts still to fill
        (the scratch buffer is then empty)."""
        pending = [v.cast("B") for v in views if v.nbytes]
        while pending and self._start < self._end:
            taken = min(pending[0].nbytes, self._end - self._start)
            pending[0][:taken] = self._scratch[self._start : self._start + taken]
            self._start += taken
            advance(pending, taken)
        if pending:
            self._start = self._end = 0
        return pending

    def _compact(self) -> None:
        """Moves the bytes received and not consumed to the scratch buffer's front."""
        if self._start:
            pending = self._end - self._start
            self._scratch[:pending] = self._scratch[self._start : self._end]
            self._start, self._end = 0, pending


class LoopStream(_Steps):
    """One read on the event loop, from a non-blocking plain socket. `timeout_seconds`
    bounds the whole read; it is checked only when a call must wait (a receive that finds
    its bytes there, the common case on a loopback or a fast link, arms no timer: a timer
    a read cost ~5 us of the loop's heap)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, scratch: bytearray, timeout_seconds: float
    ) -> None:
        super().__init__(scratch)
        self._loop = loop
        self._sock = sock
        self._deadline = loop.time() + timeout_seconds

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view.nbytes:
            try:
                view = view[self._sock.send(view) :]
            except (BlockingIOError, InterruptedError):
                await self._ready(self._loop.add_writer, self._loop.remove_writer)

    async def frame(self, max_bytes: int) -> dict[str, Any]:
        frame: dict[str, Any] = await self._drive(self._frame(max_bytes))
        return frame

    async def fill(self, views: Sequence[memoryview]) -> None:
        await self._drive(self._fill(views))

    async def _drive(self, steps: Steps) -> Any:
        try:
            buffers = next(steps)
            while True:
                buffers = steps.send(await self._recv(buffers))
        except StopIteration as done:
            return done.value

    async def _recv(self, buffers: list[memoryview]) -> int:
        while True:
            try:
                received = self._sock.recvmsg_into(buffers)[0]
            except (BlockingIOError, InterruptedError):
                await self._ready(self._loop.add_reader, self._loop.remove_reader)
                continue
            if received == 0:
                raise ConnectionClosed("the peer closed the data-plane connection mid-transfer")
            return received

    async def _ready(self, watch: Callable[..., object], unwatch: Callable[[int], object]) -> None:
        """Waits until the socket is readable (or writable: `watch`, `unwatch` say which),
        at most until the read's deadline (TimeoutError)."""
        ready = self._loop.create_future()
        fd = self._sock.fileno()
        watch(fd, _wake, ready)
        try:
            async with asyncio.timeout_at(self._deadline):
                await ready
        finally:
            unwatch(fd)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


class BlockingStream(_Steps):
    """One read in the calling thread, from a socket with a timeout (plain or TLS: a TLS
    socket has no `recvmsg_into`, so it receives into the first buffer only), through
    this thread's scratch buffer."""

    _scratches = threading.local()

    def __init__(self, sock: socket.socket) -> None:
        scratch = getattr(self._scratches, "buffer", None)
        if scratch is None:
            scratch = self._scratches.buffer = bytearray(SCRATCH_BYTES)
        super().__init__(scratch)
        self._sock = sock
        self._tls = isinstance(sock, ssl.SSLSocket)

    def frame(self, max_bytes: int) -> dict[str, Any]:
        frame: dict[str, Any] = self._drive(self._frame(max_bytes))
        return frame

    def fill(self, views: Sequence[memoryview]) -> None:
        self._drive(self._fill(views))

    def _drive(self, steps: Steps) -> Any:
        try:
            buffers = next(steps)
            while True:
                received = self._sock.recv_into(buffers[0]) if self._tls else self._sock.recvmsg_into(buffers)[0]
                if received == 0:
                    raise ConnectionClosed("the peer closed the data-plane connection mid-transfer")
                buffers = steps.send(received)
        except StopIteration as done:
            return done.value
