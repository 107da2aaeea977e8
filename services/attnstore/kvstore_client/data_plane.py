"""The byte path for clients that cannot map the daemon's arena (another node).

`DataPlane` is the one interface the client needs from a transport, so an RDMA engine
(Mooncake's Transfer Engine, NIXL) can stand in for `TcpDataPlane`: it reads a layer
range of chunks into the caller's buffers, layer-major, and fills reserved chunks.
Reservations and commits stay on gRPC.

`TcpDataPlane` speaks attnstore/data_plane_wire.py (TLS when the daemon's is on) over
connections kept in small pools: on the event loop for the async calls
(data_plane_stream.py: the kernel copies straight into the caller's buffers, no thread),
blocking sockets for `read_into_blocking` (a blocking client's reads, in its callers'
threads).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from attnstore.data_plane_wire import (
    pack_frame,
    raise_for_reply,
    recv_frame,
    recv_views,
    send_frame,
)
from attnstore.kvstore_client.data_plane_stream import PlaceStream, PlaneConnection
from attnstore.kvstore_client.pieces import DaemonProtocolError

_MAX_IDLE_CONNECTIONS = 32  # per pool
_MAX_REPLY_FRAME_BYTES = 64 * 1024 * 1024  # a reply lists at most 4096 chunk headers


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
        self.timeout_seconds = timeout_seconds
        self._idle_sockets: list[socket.socket] = []  # blocking, for read_into_blocking
        self._lock = threading.Lock()
        self._idle: list[PlaneConnection] = []  # on the event loop

    # ---- on the event loop ------------------------------------------------------------

    async def probe(self) -> None:
        """Opens a connection (its hello answered) and keeps it; raises if none gets through."""
        self.give_back(await self._connect())

    async def open_read(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int
    ) -> DataPlaneRead:
        connection = await self._connect()
        try:
            async with asyncio.timeout(self.timeout_seconds):
                reply = await connection.exchange(pack_frame(_get_request(namespace, keys, layer_start, layer_end)))
            headers = _headers(reply.get("headers"), len(keys))
        except BaseException:
            connection.abort()
            raise
        return _StreamRead(self, connection, headers)

    async def read_into(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int, place: PlaceStream
    ) -> None:
        def checked_place(headers: list[bytes]) -> Sequence[memoryview]:
            return place(_headers(headers, len(keys)))

        frame = pack_frame(_get_request(namespace, keys, layer_start, layer_end))
        await self._exchange(frame, (), checked_place)

    async def write(self, namespace: bytes, writes: Sequence[tuple[int, memoryview]]) -> int:
        frame = pack_frame({"op": "put", "namespace": namespace, "writes": [[i, d.nbytes] for i, d in writes]})
        written = (await self._exchange(frame, [data for _, data in writes], None)).get("bytes_written")
        if not isinstance(written, int):
            raise DaemonProtocolError("the data plane's put reply lacks bytes_written")
        return written

    async def _exchange(
        self, frame: bytes, payload: Sequence[memoryview], place: PlaceStream | None
    ) -> dict[str, Any]:
        """One request and its reply (and the payload `place` names) on a pooled connection,
        bounded by the timeout; a connection that failed mid-way is dropped."""
        connection = await self._connect()
        try:
            async with asyncio.timeout(self.timeout_seconds):
                reply = await connection.exchange(frame, payload, place)
        except BaseException:
            connection.abort()
            raise
        self.give_back(connection)
        return reply

    async def _connect(self) -> PlaneConnection:
        while self._idle:
            connection = self._idle.pop()
            if connection.open:
                return connection
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout_seconds):
            _, connection = await loop.create_connection(
                lambda: PlaneConnection(_MAX_REPLY_FRAME_BYTES), *self._address, ssl=self._ssl,
                server_hostname=self._server_hostname if self._ssl is not None else None,
            )  # fmt: skip
            try:
                await connection.exchange(self._hello)
            except BaseException:
                connection.abort()
                raise
        return connection

    def give_back(self, connection: PlaneConnection) -> None:
        if len(self._idle) < _MAX_IDLE_CONNECTIONS:
            self._idle.append(connection)
        else:
            connection.abort()

    # ---- blocking, in the caller's thread ------------------------------------------------

    def read_into_blocking(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int, place: PlaceStream
    ) -> None:
        sock = self._connect_blocking()
        try:
            send_frame(sock, _get_request(namespace, keys, layer_start, layer_end))
            reply = raise_for_reply(recv_frame(sock, _MAX_REPLY_FRAME_BYTES))
            recv_views(sock, place(_headers(reply.get("headers"), len(keys))))
        except BaseException:
            sock.close()
            raise
        with self._lock:
            if len(self._idle_sockets) < _MAX_IDLE_CONNECTIONS:
                self._idle_sockets.append(sock)
                return
        sock.close()

    def _connect_blocking(self) -> socket.socket:
        with self._lock:
            if self._idle_sockets:
                return self._idle_sockets.pop()
        sock = socket.create_connection(self._address, timeout=self.timeout_seconds)
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

    def close(self) -> None:
        with self._lock:
            sockets, self._idle_sockets = self._idle_sockets, []
        for sock in sockets:
            sock.close()
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.abort()


def _get_request(namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int) -> dict[str, object]:
    return {"op": "get", "namespace": namespace, "keys": list(keys), "layer_start": layer_start, "layer_end": layer_end}


def _headers(headers: object, chunk_count: int) -> list[bytes]:
    """An ok get reply's chunk headers, one per chunk asked for."""
    if not isinstance(headers, list) or len(headers) != chunk_count:
        raise DaemonProtocolError(f"the data plane sent headers for {chunk_count} chunks wrongly")
    return headers


class _StreamRead:
    """A read whose layers the caller takes as they come (`open_read`)."""

    def __init__(self, plane: TcpDataPlane, connection: PlaneConnection, headers: list[bytes]) -> None:
        self._plane = plane
        self._connection: PlaneConnection | None = connection
        self.headers = headers

    async def recv_into(self, views: Sequence[memoryview]) -> None:
        if self._connection is None:
            raise DaemonProtocolError("the data-plane read is closed")
        try:
            async with asyncio.timeout(self._plane.timeout_seconds):
                await self._connection.recv_into(views)
        except BaseException:
            self.close(complete=False)
            raise

    def close(self, complete: bool) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if complete:
            self._plane.give_back(connection)
        else:
            connection.abort()
