"""A whole data-plane read on the event loop in as few receives as possible.

The reply frame, the payload and the trailer frame come back to back on the stream (the
daemon sends the first two in one gather write). Every receive is a trip through Python
and every one that finds nothing yet a wait on the loop (a selector wake-up and a task
step), so: the reply is taken with whatever payload came with it into a small scratch
buffer in one `recv_into` (not a receive for its length and one for its body), the payload
bytes that came along are copied to the reader's buffers, and the rest of the payload is
received straight into them by `recvmsg_into` with the scratch buffer last, so the
trailer lands in the same receive as the payload's end.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Any

from attnstore.data_plane_wire import MAX_IOVECS, ConnectionClosed, advance, decode_frame, frame_length

_LENGTH = struct.Struct("!I")
# A one-chunk reply is its 4 KiB header and a few bytes: what else the first receive brings
# is payload, copied out once; a reply longer than this (many chunks) gets its own buffer.
SCRATCH_BYTES = 8 * 1024


class LoopStream:
    """One read's request out and frames and payload in, on one non-blocking plain socket,
    through `scratch`. `timeout_seconds` bounds the whole read; it is checked only when a
    call must wait (a receive that finds its bytes there, the common case on a loopback or
    a fast link, arms no timer: a timer a read cost ~5 us of the loop's heap)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, scratch: bytearray, timeout_seconds: float
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._scratch = memoryview(scratch)
        self._start = self._end = 0  # scratch[start:end]: received, not yet consumed
        self._deadline = loop.time() + timeout_seconds

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view.nbytes:
            try:
                view = view[self._sock.send(view) :]
            except (BlockingIOError, InterruptedError):
                await self._ready(self._loop.add_writer, self._loop.remove_writer)

    async def frame(self, max_bytes: int) -> dict[str, Any]:
        """The next frame (FrameError past `max_bytes`, as `recv_frame`)."""
        self._compact()
        while self._end < _LENGTH.size:
            await self._recv_into_scratch()
        length = frame_length(_LENGTH.unpack_from(self._scratch)[0], max_bytes)
        frame_end = _LENGTH.size + length
        if frame_end > len(self._scratch):  # a long reply (many headers): its own buffer
            body = bytearray(length)
            have = self._end - _LENGTH.size
            body[:have] = self._scratch[_LENGTH.size : self._end]
            self._start = self._end = 0
            await self.fill([memoryview(body)[have:]])
            return decode_frame(body)
        while self._end < frame_end:
            await self._recv_into_scratch()
        self._start = frame_end
        return decode_frame(self._scratch[_LENGTH.size : frame_end])

    async def fill(self, views: Sequence[memoryview]) -> None:
        """Fills `views` in order: first from bytes already received, then from the socket,
        whatever follows the last view landing in the scratch buffer."""
        pending = self.drain_into(views)
        while pending:
            batch = pending[:MAX_IOVECS]
            wanted = sum(view.nbytes for view in batch)
            tail = [self._scratch] if len(batch) == len(pending) and len(batch) < MAX_IOVECS else []
            received = await self._recv(batch + tail)
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

    async def _recv_into_scratch(self) -> None:
        self._end += await self._recv([self._scratch[self._end :]])

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
