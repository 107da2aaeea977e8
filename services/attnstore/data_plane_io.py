"""The data plane's socket loops in C (data_plane_io.c), built by c_build on first use.

A 0.5 MB read moves in about 80 us on this machine's loopback (the socket limit), yet a
Get took 210-270 us end to end: a Python loop takes the GIL back after each syscall (and
waits for it beside the daemon's event loop), and a socket with a timeout polls before
every recv or send. Here a frame, a payload or a gather write is one ctypes call, which
runs without the GIL; poll(2) runs only when a syscall would block.

Plain sockets only: a TLS socket's bytes go through Python's ssl module (the callers in
data_plane_wire.py keep their Python loops for it, and wherever the C is unavailable:
no compiler, a failed build or probe, `ATTNSTORE_DATA_PLANE_IO_UNAVAILABLE=1`).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

from attnstore import errors
from attnstore.c_build import load_probed

SOURCE = Path(__file__).with_name("data_plane_io.c")
UNAVAILABLE_VARIABLE = "ATTNSTORE_DATA_PLANE_IO_UNAVAILABLE"
_CLOSED, _TIMEOUT, _TOO_LONG, _ERRNO_BASE = -1, -2, -3, 1000  # data_plane_io.c's DP_ codes
_FRAME_BUFFER_BYTES = 64 * 1024  # a thread's buffer for frame bodies; a longer one gets its own
_c_long, _c_int, _c_size, _c_ptr = ctypes.c_long, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", _c_ptr), ("iov_len", _c_size)]


class FrameError(errors.InvalidArgument):
    """A frame that is not a msgpack map of the expected shape, or is too long."""


class ConnectionClosed(errors.Unavailable):
    """The peer closed the stream before a frame or payload was complete."""


class SocketLoops:
    def __init__(self, library: ctypes.CDLL) -> None:
        self._send, self._recv = library.dp_send, library.dp_recv
        self._recv_frame, self._exchange = library.dp_recv_frame, library.dp_exchange
        for fn in (self._send, self._recv):
            fn.argtypes, fn.restype = [_c_int, ctypes.POINTER(_Iovec), _c_int, _c_int], _c_long
        self._recv_frame.argtypes = [_c_int, _c_ptr, _c_size, _c_size, _c_int]
        self._exchange.argtypes = [_c_int, ctypes.c_char_p, _c_size, _c_ptr, _c_size, _c_size, _c_int]
        self._recv_frame.restype = self._exchange.restype = _c_long
        self._buffers = threading.local()

    def send(self, sock: socket.socket, views: Sequence[memoryview | bytes]) -> bool:
        """Sends every view; False (nothing sent) when one is a read-only buffer ctypes
        cannot address (the caller sends it from Python)."""
        built = _iovecs(views)
        if built is None:
            return False
        iov, _exported = built
        _check(self._send(sock.fileno(), iov, len(iov), _timeout_ms(sock)))
        return True

    def recv(self, sock: socket.socket, views: Sequence[memoryview]) -> None:
        """Fills the (writable) views in order."""
        built = _iovecs(views)
        if built is None:
            raise TypeError("data_plane_io receives only into writable buffers")
        iov, _exported = built
        _check(self._recv(sock.fileno(), iov, len(iov), _timeout_ms(sock)))

    def recv_frame(self, sock: socket.socket, max_bytes: int) -> memoryview:
        """The next frame's body (valid until this thread's next call)."""
        buffer, address = self._buffer()
        return self._body(sock, self._recv_frame(sock.fileno(), address, len(buffer), max_bytes, _timeout_ms(sock)))

    def exchange(self, sock: socket.socket, frame: bytes, max_bytes: int) -> memoryview:
        """Sends `frame`, then answers the reply frame's body as `recv_frame` does."""
        buffer, address = self._buffer()
        length = self._exchange(sock.fileno(), frame, len(frame), address, len(buffer), max_bytes, _timeout_ms(sock))
        return self._body(sock, length)

    def _body(self, sock: socket.socket, length: int) -> memoryview:
        buffer, _ = self._buffer()
        _check(length)
        if length <= len(buffer):
            return memoryview(buffer)[:length]
        body = memoryview(bytearray(length))  # over the thread's buffer: its own, still unread
        self.recv(sock, [body])
        return body

    def _buffer(self) -> tuple[bytearray, int]:
        held = getattr(self._buffers, "held", None)
        if held is None:
            buffer = bytearray(_FRAME_BUFFER_BYTES)
            held = self._buffers.held = (buffer, ctypes.addressof(ctypes.c_char.from_buffer(buffer)))
        return held


def _iovecs(views: Sequence[memoryview | bytes]) -> tuple[ctypes.Array[_Iovec], list[object]] | None:
    """An iovec per non-empty view and the ctypes objects that keep them exported; None when
    a view is read-only and not a whole `bytes` (no address ctypes can take)."""
    keep: list[object] = []
    chosen = [view for view in views if len(view)]
    iov = (_Iovec * len(chosen))()
    for item, view in zip(iov, chosen, strict=True):
        if isinstance(view, bytes):
            address = ctypes.cast(ctypes.c_char_p(view), _c_ptr).value
            item.iov_len = len(view)
        elif not view.readonly and view.contiguous:
            exported = ctypes.c_char.from_buffer(view)  # its first byte: no array type per length
            keep.append(exported)
            address, item.iov_len = ctypes.addressof(exported), view.nbytes
        elif isinstance(view.obj, bytes) and view.nbytes == len(view.obj) and view.contiguous:
            address = ctypes.cast(ctypes.c_char_p(view.obj), _c_ptr).value
            item.iov_len = view.nbytes
        else:
            return None
        item.iov_base = address
    return iov, keep


def _timeout_ms(sock: socket.socket) -> int:
    timeout = sock.gettimeout()
    return -1 if timeout is None else max(0, int(timeout * 1000))


def _check(result: int) -> None:
    """Raises what data_plane_wire's Python loops would for a negative result."""
    if result >= 0:
        return
    if result == _CLOSED:
        raise ConnectionClosed("the peer closed the data-plane connection mid-transfer")
    if result == _TIMEOUT:
        raise TimeoutError("the data-plane connection timed out")
    if result == _TOO_LONG:
        raise FrameError("a data-plane frame exceeds the length limit")
    code = -result - _ERRNO_BASE
    raise OSError(code, os.strerror(code) if code > 0 else errno.errorcode.get(code, "socket error"))


def _probe(loops: SocketLoops) -> str | None:
    """A frame and a gather write over a socket pair, received back byte for byte."""
    left, right = socket.socketpair()
    try:
        left.settimeout(5.0)
        right.settimeout(5.0)
        payload = memoryview(bytearray(os.urandom(50_000)))
        sent_ok = loops.send(left, [b"\x00\x00\x00\x03abc", payload[:20_000], payload[20_000:]])
        body = bytes(loops.recv_frame(right, 16))
        received = memoryview(bytearray(len(payload)))
        loops.recv(right, [received[:1], received[1:]])
        if not sent_ok or body != b"abc" or received != payload:
            return "the probe's bytes came back wrong"
    finally:
        left.close()
        right.close()
    return None


@functools.cache
def socket_loops() -> SocketLoops | None:
    """The C loops, or None (once per process; the reason is logged)."""
    loops, _ = load_probed(SOURCE, UNAVAILABLE_VARIABLE, SocketLoops, _probe)
    return loops
