"""ParkedConnection over a real socket pair: each answer received in the connection's own
thread, the connection reused, and a peer that never answers, hangs up or sends bytes
nobody asked for closes it (a bounded wait, never a stuck read)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from attnstore.data_plane_wire import ConnectionClosed, recv_exactly_into
from attnstore.kvstore_client.parked import ParkedConnection


def _receive_four(sock: socket.socket) -> tuple[bytes, str]:
    """The answer's four bytes and the name of the thread that received them."""
    out = bytearray(4)
    recv_exactly_into(sock, memoryview(out))
    return bytes(out), threading.current_thread().name


def _echo_twice(peer: socket.socket) -> threading.Thread:
    """Answers each of two 4-byte requests with its bytes reversed."""

    def answer() -> None:
        for _ in range(2):
            request = peer.recv(4)
            time.sleep(0.05)  # the reader is parked by now
            peer.sendall(request[::-1])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def test_each_answer_is_received_in_the_connections_thread_and_the_connection_is_reused() -> None:
    ours, peer = socket.socketpair()
    with peer:
        server = _echo_twice(peer)
        connection = ParkedConnection(ours, timeout_seconds=5)

        async def two_reads() -> list[tuple[bytes, str]]:
            return [await connection.read(request, _receive_four) for request in (b"abcd", b"wxyz")]

        answers = asyncio.run(two_reads())
        server.join()
        connection.close()
    assert [data for data, _ in answers] == [b"dcba", b"zyxw"]
    assert {name for _, name in answers} == {"data-plane-parked"}


def test_a_peer_that_never_answers_costs_the_timeout_and_closes_the_connection() -> None:
    ours, peer = socket.socketpair()
    with peer:
        connection = ParkedConnection(ours, timeout_seconds=0.3)
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            asyncio.run(connection.read(b"abcd", _receive_four))
        assert time.monotonic() - began < 2
        assert connection.closed
        with pytest.raises(ConnectionClosed):
            asyncio.run(connection.read(b"abcd", _receive_four))


def test_a_peer_that_stops_mid_answer_costs_the_timeout() -> None:
    """The answer's first bytes wake the thread; the rest never comes (kernel timeout)."""
    ours, peer = socket.socketpair()
    with peer:
        connection = ParkedConnection(ours, timeout_seconds=0.3)

        async def read() -> None:
            task = asyncio.ensure_future(connection.read(b"abcd", _receive_four))
            await asyncio.sleep(0.05)
            peer.sendall(b"dc")  # half of the answer
            await task

        with pytest.raises(TimeoutError):
            asyncio.run(read())
        assert connection.closed


def test_a_peer_that_hangs_up_closes_the_connection_while_it_idles_and_fails_a_read() -> None:
    ours, peer = socket.socketpair()
    connection = ParkedConnection(ours, timeout_seconds=5)
    peer.close()
    deadline = time.monotonic() + 5
    while not connection.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert connection.closed

    ours, peer = socket.socketpair()
    connection = ParkedConnection(ours, timeout_seconds=5)

    async def read_then_hang_up() -> None:
        task = asyncio.ensure_future(connection.read(b"abcd", _receive_four))
        await asyncio.sleep(0.05)
        peer.close()
        await task

    with pytest.raises(ConnectionClosed):
        asyncio.run(read_then_hang_up())


def test_bytes_nobody_asked_for_close_the_connection() -> None:
    ours, peer = socket.socketpair()
    with peer:
        connection = ParkedConnection(ours, timeout_seconds=5)
        peer.sendall(b"stray")
        deadline = time.monotonic() + 5
        while not connection.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert connection.closed
