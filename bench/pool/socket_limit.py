"""The limit of the machine's loopback: a plain TCP server that answers an 8-byte size with
that many bytes from one preallocated buffer, and clients that `recv_into` their own
buffer. No framing, no lookup, no checksum: what any byte path over TCP can at most reach."""

from __future__ import annotations

import socket
import struct
import threading

_SIZE = struct.Struct("!Q")


class SocketLimitServer:
    def __init__(self, max_bytes: int) -> None:
        self._payload = memoryview(bytearray(max_bytes))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept_forever, daemon=True).start()

    def _accept_forever(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = bytearray(_SIZE.size)
            while _recv_into(conn, memoryview(request)):
                conn.sendall(self._payload[: _SIZE.unpack(request)[0]])

    def close(self) -> None:
        self._listener.close()


class SocketLimitClient:
    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_into(self, out: memoryview) -> None:
        self._sock.sendall(_SIZE.pack(out.nbytes))
        if not _recv_into(self._sock, out):
            raise ConnectionError("the socket-limit server closed the connection")

    def close(self) -> None:
        self._sock.close()


def _recv_into(sock: socket.socket, view: memoryview) -> bool:
    while view.nbytes:
        received = sock.recv_into(view)
        if not received:
            return False
        view = view[received:]
    return True
