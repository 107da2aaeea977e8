"""The byte path for clients that cannot map the daemon's arena (another node).

`DataPlane` is the one interface the client needs from a transport, so an RDMA engine
(Mooncake's Transfer Engine, NIXL) can stand in for `TcpDataPlane`: it reads a layer
range of chunks into the caller's buffers, layer-major, and fills reserved chunks.
Reservations and commits stay on gRPC.

`TcpDataPlane` speaks attnstore/data_plane_wire.py over blocking sockets (TLS when the
daemon's is on) kept in a small pool; each transfer runs in a worker thread so the event
loop is free while the kernel copies straight into the caller's memory (`recv_into`).
A whole read into buffers (`read_into`) on a plain socket runs on the event loop itself
(non-blocking: a recv that finds its bytes waits for nothing, loop_stream.py) while its
payload is small: up to `_LOOP_PAYLOAD_MAX_BYTES`, or beside other reads up to
`_LOOP_BESIDE_OTHERS_MAX_BYTES`. A larger one (judged by the last read's payload; a read
that finds its payload larger than judged hands the payload to a thread) is sent from the
loop and received by the thread of a parked connection (parked.py); any read under TLS is
one trip to a thread for the whole read. A read that hands out layers as they come
(`open_read`) takes one trip per call.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from attnstore.data_plane_wire import (
    pack_frame,
    raise_for_reply,
    recv_frame,
    recv_views,
    send_frame,
    send_views,
)
from attnstore.kvstore_client.loop_stream import LoopStream
from attnstore.kvstore_client.parked import ParkedConnection
from attnstore.kvstore_client.pieces import DaemonProtocolError

_MAX_IDLE_CONNECTIONS = 32
# Threads moving bytes at once: one per concurrent transfer (asyncio's default executor
# has cpu_count + 4, which would cap 16 concurrent readers at 6 on a small node).
_TRANSFER_THREADS = 64
T = TypeVar("T")
_MAX_REPLY_FRAME_BYTES = 64 * 1024 * 1024  # a reply lists at most 4096 chunk headers
# A whole read's payload up to this is received on the event loop; past it the whole read
# runs in a thread, where its receives wait in the kernel: from the loop, the reply's wake-up
# and then the hop to a thread were two waits for a core on a busy node (one 5.9 MB reader
# 1.45-1.55 -> 1.76-2.13 GB/s median of 12 rounds, two runs; 8 MB 1.57-1.64 -> 1.62-1.84;
# load 5-7, 2 cores).
_LOOP_PAYLOAD_MAX_BYTES = 4 * 1024 * 1024
# Beside other reads, up to this: there the copy costs less than a hop to a thread and back
# (0.5 MB at 4 and 16 readers: 1.85-2.56 GB/s on the loop against 0.97-1.78 in threads, 3
# A/B rounds, load 13.7); past it reads copy in parallel in threads (16 readers of 5.9 MB:
# 0.67-0.84 GB/s on the loop against 1.53-1.71; of 2 MB 1.03-2.21 against 1.49-2.13).
_LOOP_BESIDE_OTHERS_MAX_BYTES = 1024 * 1024
PlaceStream = Callable[[list[bytes]], Sequence[memoryview]]  # chunk headers -> buffers of the stream


class DataPlaneRead(Protocol):
    """An open read: the chunks' header bytes, then their layers in request order."""

    headers: list[bytes]

    async def recv_into(self, views: Sequence[memoryview]) -> None:
        """Fills `views` in order with the next bytes of the layer-major stream."""
        ...

    def close(self, complete: bool) -> None:
        """Ends the read; `complete` False (stopped early, failed) discards the stream."""
        ...


class DataPlane(Protocol):
    name: str

    async def open_read(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int
    ) -> DataPlaneRead:
        """Starts a read of layers [layer_start, layer_end) of `keys`; the daemon holds the
        chunks until the last byte is sent (NotFound when one is not stored)."""
        ...

    async def read_into(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int, place: PlaceStream
    ) -> None:
        """A whole read at once: `place(headers)` (called once, perhaps off the event loop)
        answers the buffers the layer-major stream fills, in order."""
        ...

    def read_into_blocking(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int, place: PlaceStream
    ) -> None:
        """`read_into` in the calling thread (a blocking client's path: no event loop)."""
        ...

    async def write(self, namespace: bytes, writes: Sequence[tuple[int, memoryview]]) -> int:
        """Fills reservations (write id, whole chunk bytes); returns the bytes written."""
        ...

    def close(self) -> None: ...


class TcpDataPlane:
    name = "dataplane"

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        server_hostname: str | None,
        token: str | None,
        timeout_seconds: float,
    ) -> None:
        self._address = (host, port)
        self._ssl = ssl_context
        self._server_hostname = server_hostname or host
        self._hello = pack_frame({"op": "hello", "token": token})
        self._timeout_seconds = timeout_seconds
        self._idle: list[socket.socket] = []
        self._parked: list[ParkedConnection] = []  # for large whole reads (parked.py)
        self._closed = False
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(_TRANSFER_THREADS, thread_name_prefix="data-plane")
        self._reads_in_flight = 0  # whole reads under way (`read_into`, on the event loop)
        self._last_payload_bytes = 0  # of the last whole read (the next is likely the same)

    async def in_thread(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    def connect(self) -> socket.socket:
        """A connection past its hello: one from the pool, else a new one."""
        sock = self._take_idle()
        if sock is not None:
            return sock
        sock = socket.create_connection(self._address, timeout=self._timeout_seconds)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._server_hostname)
            sock.sendall(self._hello)
            raise_for_reply(recv_frame(sock, _MAX_REPLY_FRAME_BYTES))
        except BaseException:
            sock.close()
            raise
        return sock

    def _take_idle(self) -> socket.socket | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < _MAX_IDLE_CONNECTIONS:
                self._idle.append(sock)
                return
        sock.close()

    async def open_read(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int
    ) -> DataPlaneRead:
        return await self.in_thread(
            self._open_read, _get_request(namespace, keys, layer_start, layer_end), len(keys)
        )

    async def read_into(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int, place: PlaceStream
    ) -> None:
        self._reads_in_flight += 1
        try:
            # An SSL socket cannot be read from the loop: one trip to a thread. A large payload,
            # or beside other reads a smaller one, is received by a parked connection's thread,
            # so reads side by side copy in parallel.
            request = _get_request(namespace, keys, layer_start, layer_end)
            large = self._last_payload_bytes > self._loop_payload_limit()
            if self._ssl is not None or (large and self._reads_in_flight == 1):
                await self._read_in_thread(request, len(keys), place)
                return
            read_whole = self._read_whole_parked if large else self._read_whole_on_loop
            if not await read_whole({**request, "unheld": True}, len(keys), place):
                await read_whole(request, len(keys), place)
        finally:
            self._reads_in_flight -= 1

    async def _read_in_thread(self, request: dict[str, object], chunk_count: int, place: PlaceStream) -> None:
        """A whole read in a thread; alone, its request sent first from the loop on a pooled
        plain connection that takes it at once, so the daemon answers while the thread wakes
        (beside other reads a parked connection's thread receives, _read_whole_parked)."""
        sock = self._take_idle() if self._ssl is None else None
        unsent = pack_frame({**request, "unheld": True})
        if sock is not None:
            try:
                unsent = unsent[sock.send(unsent, socket.MSG_DONTWAIT) :]
            except BlockingIOError:
                pass
            except BaseException:
                sock.close()
                raise
        await self.in_thread(self._read_twice, request, chunk_count, place, sock, unsent)

    async def _read_whole_parked(
        self, request: dict[str, object], chunk_count: int, place: PlaceStream
    ) -> bool:
        """A whole read whose answer a parked connection's thread receives (parked.py)."""
        connection = self._take_parked() or ParkedConnection(
            await self.in_thread(self.connect), self._timeout_seconds
        )
        valid = await connection.read(
            pack_frame(request), lambda sock: self._receive_whole(sock, chunk_count, place)
        )
        with self._lock:
            if not self._closed and len(self._parked) < _MAX_IDLE_CONNECTIONS:
                self._parked.append(connection)
                return valid
        connection.close()
        return valid

    def _take_parked(self) -> ParkedConnection | None:
        with self._lock:
            while self._parked:
                connection = self._parked.pop()
                if not connection.closed:  # the daemon hung up on it while it idled
                    return connection
        return None

    def _loop_payload_limit(self) -> int:
        """The largest payload a whole read receives on the event loop now."""
        return _LOOP_BESIDE_OTHERS_MAX_BYTES if self._reads_in_flight > 1 else _LOOP_PAYLOAD_MAX_BYTES

    async def _read_whole_on_loop(
        self, request: dict[str, object], chunk_count: int, place: PlaceStream
    ) -> bool:
        """`_read_whole` driven from the event loop: the wait for the reply and a small
        payload take no hop to a thread and back (each hop waits for a core on a busy node:
        a 0.5 MB Get's median went from 396-409 to 278-297 us this way, load 10-12 on 2
        cores; the blocking client's is 233-254), and each receive waits only when the
        kernel has nothing yet (loop_stream.py)."""
        sock = self._take_idle() or await self.in_thread(self.connect)
        complete = valid = False
        try:
            with LoopStream(asyncio.get_running_loop(), sock, self._timeout_seconds) as stream:
                await stream.send(pack_frame(request))
                reply = raise_for_reply(await stream.frame(_MAX_REPLY_FRAME_BYTES))
                views = stream.take_buffered(place(_headers_of(reply, chunk_count)))
                self._last_payload_bytes = sum(view.nbytes for view in views)
                if self._last_payload_bytes > self._loop_payload_limit():  # larger than judged: in a thread
                    sock.settimeout(self._timeout_seconds)
                    await self.in_thread(recv_views, sock, views)
                    sock.setblocking(False)
                else:
                    await stream.fill(views)
                trailer = reply.get("trailer") is True
                valid = not trailer or _trailer_valid(await stream.frame(_MAX_REPLY_FRAME_BYTES))
                if not stream.drained:
                    raise DaemonProtocolError("the data plane sent bytes past its answer")
            complete = True
        finally:
            if complete:
                sock.settimeout(self._timeout_seconds)
                self.give_back(sock)
            else:
                sock.close()
        return valid

    def read_into_blocking(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int, place: PlaceStream
    ) -> None:
        # Unheld first: the daemon sends chunks in its DRAM without holding them on its event
        # loop and says after the bytes whether they stayed put; a read that raced an
        # eviction (rare) is asked again, held, and `place` is called again.
        self._read_twice(_get_request(namespace, keys, layer_start, layer_end), len(keys), place)

    def _read_twice(
        self, request: dict[str, object], chunk_count: int, place: PlaceStream,
        sock: socket.socket | None = None, unsent: bytes | None = None,
    ) -> None:  # fmt: skip
        """The unheld read, then the held one if need be; `sock`: a connection on which
        the unheld request went out but for `unsent`."""
        if not self._read_whole({**request, "unheld": True}, chunk_count, place, sock, unsent):
            self._read_whole(request, chunk_count, place)

    def _read_whole(
        self, request: dict[str, object], chunk_count: int, place: PlaceStream,
        sock: socket.socket | None = None, unsent: bytes | None = None,
    ) -> bool:  # fmt: skip
        """One whole read on a blocking connection (`sock`, where `request` went out but for
        `unsent`); whether its bytes are the chunks'."""
        if sock is None:
            sock, unsent = self.connect(), pack_frame(request)
        try:
            if unsent:
                sock.sendall(unsent)
            valid = self._receive_whole(sock, chunk_count, place)
        except BaseException:
            sock.close()
            raise
        self.give_back(sock)
        return valid

    def _receive_whole(self, sock: socket.socket, chunk_count: int, place: PlaceStream) -> bool:
        """A whole read's answer on a blocking socket; whether its bytes are the chunks'."""
        reply = raise_for_reply(recv_frame(sock, _MAX_REPLY_FRAME_BYTES))
        views = place(_headers_of(reply, chunk_count))
        self._last_payload_bytes = sum(view.nbytes for view in views)
        recv_views(sock, views)
        return reply.get("trailer") is not True or _trailer_valid(recv_frame(sock, _MAX_REPLY_FRAME_BYTES))

    def _open_read(self, request: dict[str, object], chunk_count: int) -> _TcpRead:
        """Sends `request` and takes the reply."""
        sock = self.connect()
        try:
            sock.sendall(pack_frame(request))
            reply = raise_for_reply(recv_frame(sock, _MAX_REPLY_FRAME_BYTES))
            headers = _headers_of(reply, chunk_count)
        except BaseException:
            sock.close()
            raise
        return _TcpRead(self, sock, headers, trailer=reply.get("trailer") is True)

    async def write(self, namespace: bytes, writes: Sequence[tuple[int, memoryview]]) -> int:
        return await self.in_thread(self._write, namespace, writes)

    def _write(self, namespace: bytes, writes: Sequence[tuple[int, memoryview]]) -> int:
        sock = self.connect()
        try:
            send_frame(
                sock, {"op": "put", "namespace": namespace, "writes": [[i, d.nbytes] for i, d in writes]}
            )
            send_views(sock, [data for _, data in writes])
            written = raise_for_reply(recv_frame(sock, _MAX_REPLY_FRAME_BYTES)).get("bytes_written")
        except BaseException:
            sock.close()
            raise
        self.give_back(sock)
        if not isinstance(written, int):
            raise DaemonProtocolError("the data plane's put reply lacks bytes_written")
        return written

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            parked, self._parked = self._parked, []
        for sock in idle:
            sock.close()
        for connection in parked:
            connection.close()
        self._threads.shutdown(wait=False)


def _headers_of(reply: dict[str, object], chunk_count: int) -> list[bytes]:
    headers = reply.get("headers")
    if not isinstance(headers, list) or len(headers) != chunk_count:
        raise DaemonProtocolError(f"the data plane sent headers for {chunk_count} chunks wrongly")
    return headers


def _trailer_valid(trailer: dict[str, object]) -> bool:
    """Whether an unheld send's bytes are the chunks' (its trailer frame says)."""
    valid = raise_for_reply(trailer).get("valid")
    if not isinstance(valid, bool):
        raise DaemonProtocolError("the data plane's trailer lacks valid")
    return valid


def _get_request(
    namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int
) -> dict[str, object]:
    return {
        "op": "get",
        "namespace": namespace,
        "keys": list(keys),
        "layer_start": layer_start,
        "layer_end": layer_end,
    }


class _TcpRead:
    def __init__(
        self, plane: TcpDataPlane, sock: socket.socket, headers: list[bytes], *, trailer: bool
    ) -> None:
        """`trailer`: an unheld send, whose validity follows the payload."""
        self._plane = plane
        self._sock: socket.socket | None = sock
        self.headers = headers
        self._trailer = trailer

    async def recv_into(self, views: Sequence[memoryview]) -> None:
        await self._plane.in_thread(self.recv_all, views)

    def recv_all(self, views: Sequence[memoryview]) -> None:
        if self._sock is None:
            raise DaemonProtocolError("the data-plane read is closed")
        recv_views(self._sock, views)

    def recv_trailer(self) -> bool:
        """Whether the bytes received are the chunks' (an unheld send's trailer says)."""
        if not self._trailer:
            return True
        if self._sock is None:
            raise DaemonProtocolError("the data-plane read is closed")
        return _trailer_valid(recv_frame(self._sock, _MAX_REPLY_FRAME_BYTES))

    def close(self, complete: bool) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if complete:
            self._plane.give_back(sock)
        else:
            sock.close()
