"""A data-plane connection with a thread of its own, parked until the daemon answers.

Large whole reads copy in threads, so reads side by side copy on every core. Handing each
read to an executor thread cost a wake-up of that thread and a pass of the GIL to it
before its request even went out, then the wake-up of the loop at the end: the async SDK's
hop, ~100-250 us and two context switches a read on a busy node. Here the event loop sends
the request itself (a few hundred bytes, taken at once) and the connection's thread, parked
in a blocking `recv(MSG_PEEK)`, is woken by the kernel when the answer arrives, the wake-up
any receive waits for; only the wake-up of the loop with the result remains.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from attnstore.data_plane_wire import ConnectionClosed

T = TypeVar("T")


@dataclass(frozen=True)
class _Job(Generic[T]):
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T]
    receive: Callable[[socket.socket], T]


class ParkedConnection:
    """A plain connection past its hello whose thread runs each answer's receive. Closed
    (socket and thread) when a read fails, times out or the daemon hangs up."""

    def __init__(self, sock: socket.socket, timeout_seconds: float) -> None:
        self._sock = sock
        self._timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._job: _Job | None = None
        self.closed = False
        # Blocking in the kernel, which bounds each receive (Python's timeout would poll before
        # each); a parked receive that times out parks again, as a read's own timer bounds it.
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout_seconds))
        threading.Thread(target=self._serve, name="data-plane-parked", daemon=True).start()

    async def read(self, request: bytes, receive: Callable[[socket.socket], T]) -> T:
        """Sends `request` and returns `receive(sock)`, run in the connection's thread once
        the answer's first bytes are in (the socket then blocks with the client's timeout);
        TimeoutError when no answer is complete within the timeout."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self.closed:
                raise ConnectionClosed("the data-plane connection is closed")
            self._job = _Job(loop, future, receive)
        try:
            sent = self._sock.send(request, socket.MSG_DONTWAIT)
        except OSError:
            self.close()
            raise
        if sent != len(request):  # an empty send buffer takes a request whole; a stream cut short is lost
            self.close()
            raise ConnectionClosed("the data-plane connection did not take the request")
        timer = loop.call_later(self._timeout_seconds, self._expire, future)
        try:
            return await future
        finally:
            timer.cancel()

    def _expire(self, future: asyncio.Future[T]) -> None:
        if not future.done():
            future.set_exception(TimeoutError("the data plane did not answer in time"))
            self.close()  # wakes the parked or receiving thread, which then ends

    def close(self) -> None:
        with self._lock:
            self.closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected any more

    def _serve(self) -> None:
        while True:
            try:
                answered = bool(self._sock.recv(1, socket.MSG_PEEK))
            except BlockingIOError:  # idle past the timeout
                continue
            except OSError:
                answered = False
            with self._lock:
                job, self._job = self._job, None
                # bytes nobody asked for (no job) are a broken stream
                self.closed = self.closed or not answered or job is None
                closed = self.closed
            if closed:
                self._sock.close()
                if job is not None:
                    _settle(job, None, ConnectionClosed("the data-plane connection closed"))
                return
            assert job is not None
            try:
                result = job.receive(self._sock)
            except BaseException as exc:  # noqa: BLE001 - every failure goes to the awaiting read
                self.close()
                self._sock.close()
                timed_out = isinstance(exc, BlockingIOError)  # the kernel's receive timeout
                _settle(job, None, TimeoutError("the data plane stalled mid-answer") if timed_out else exc)
                return
            _settle(job, result, None)


def _timeval(seconds: float) -> bytes:
    return struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))


def _settle(job: _Job[T], result: T | None, error: BaseException | None) -> None:
    def settle() -> None:
        if job.future.done():  # timed out meanwhile
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)  # type: ignore[arg-type]

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass  # the loop is closed: nobody awaits the read
