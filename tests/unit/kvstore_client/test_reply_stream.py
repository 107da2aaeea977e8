"""The reply stream's parsing over real socket pairs: a reply, a payload and a trailer sent
as one write or in pieces of every size arrive whole and in place, on the event loop and
in a thread, with replies short and longer than the scratch buffer."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnstore.data_plane_wire import ConnectionClosed, pack_frame
from attnstore.kvstore_client.reply_stream import SCRATCH_BYTES, BlockingStream, LoopStream

Received = tuple[dict[str, object], list[bytes], dict[str, object]]  # reply, payload parts, trailer
Read = Callable[[socket.socket, list[int]], Received]


def _exchange(headers: list[bytes], payload: bytes) -> bytes:
    return (
        pack_frame({"ok": True, "headers": headers, "trailer": True})
        + payload
        + pack_frame({"ok": True, "valid": True})
    )


def _send_in_pieces(sock: socket.socket, data: bytes, piece: int) -> threading.Thread:
    def send() -> None:
        for at in range(0, len(data), piece):
            sock.sendall(data[at : at + piece])

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def _read_blocking(sock: socket.socket, sizes: list[int]) -> Received:
    stream = BlockingStream(sock)
    reply = stream.frame(1 << 24)
    outs = [bytearray(size) for size in sizes]
    stream.fill([memoryview(out) for out in outs])
    return reply, [bytes(out) for out in outs], stream.frame(1 << 20)


def _read_on_loop(sock: socket.socket, sizes: list[int]) -> Received:
    async def read() -> Received:
        sock.setblocking(False)
        stream = LoopStream(asyncio.get_running_loop(), sock, bytearray(SCRATCH_BYTES), timeout_seconds=10)
        reply = await stream.frame(1 << 24)
        outs = [bytearray(size) for size in sizes]
        await stream.fill([memoryview(out) for out in outs])
        return reply, [bytes(out) for out in outs], await stream.frame(1 << 20)

    return asyncio.run(read())


READERS = {"blocking": _read_blocking, "on a loop": _read_on_loop}


@pytest.mark.parametrize("read", list(READERS.values()), ids=list(READERS))
@settings(max_examples=40, deadline=None)
@given(
    header_count=st.integers(1, 5),  # 4 KiB headers: two or more overflow the scratch buffer
    sizes=st.lists(st.integers(0, 40_000), min_size=1, max_size=4),
    piece=st.sampled_from([1, 7, 4096, 65536, 1 << 30]),
)
def test_every_byte_lands_in_place_however_the_stream_is_cut(
    read: Read, header_count: int, sizes: list[int], piece: int
) -> None:
    headers = [bytes([index]) * 4096 for index in range(header_count)]
    parts = [bytes([(index * 31 + at) % 251 for at in range(size)]) for index, size in enumerate(sizes)]
    left, right = socket.socketpair()
    with left, right:
        right.settimeout(10)
        sender = _send_in_pieces(left, _exchange(headers, b"".join(parts)), piece)
        reply, received, trailer = read(right, sizes)
        sender.join()
    assert reply == {"ok": True, "headers": headers, "trailer": True}
    assert received == parts
    assert trailer == {"ok": True, "valid": True}


@pytest.mark.parametrize("read", list(READERS.values()), ids=list(READERS))
def test_a_peer_that_closes_mid_payload_is_a_closed_connection(read: Read) -> None:
    left, right = socket.socketpair()
    with right:
        right.settimeout(10)
        with left:
            left.sendall(_exchange([b"h" * 4096], b"x" * 1000)[:-600])
        with pytest.raises(ConnectionClosed):
            read(right, [1000])
