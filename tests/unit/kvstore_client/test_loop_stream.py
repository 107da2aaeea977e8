"""LoopStream over a real socket pair: frames and payloads split anywhere by the sender,
frames longer than its buffer, a payload followed by the next frame, a peer gone mid-payload
and a peer that never answers."""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from attnstore.data_plane_wire import ConnectionClosed, pack_frame
from attnstore.kvstore_client.loop_stream import LoopStream


def _answer(peer: socket.socket, pieces: list[bytes], pause_seconds: float) -> threading.Thread:
    """Sends `pieces` one by one from a thread, pausing between them (so the reader waits)."""

    def send() -> None:
        for piece in pieces:
            time.sleep(pause_seconds)
            peer.sendall(piece)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _split(data: bytes, at: list[int]) -> list[bytes]:
    bounds = [0, *at, len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


async def _read(
    sock: socket.socket, payload_bytes: list[int], timeout_seconds: float = 5.0
) -> tuple[dict[str, Any], bytes, dict[str, Any], bool]:
    """A reply frame, a payload into views of `payload_bytes`, a trailer frame; and whether
    nothing was left over."""
    stream = LoopStream(asyncio.get_running_loop(), sock, timeout_seconds)
    await stream.send(b"request")
    reply = await stream.frame(1 << 20)
    outs = [bytearray(size) for size in payload_bytes]
    await stream.fill(stream.take_buffered([memoryview(out) for out in outs]))
    trailer = await stream.frame(1 << 20)
    return reply, b"".join(outs), trailer, stream.drained


PAYLOAD = bytes(range(256)) * 300  # 76,800 bytes
SHORT = pack_frame({"ok": True, "headers": [b"h" * 4096]})  # fits the stream's buffer
LONG = pack_frame({"ok": True, "headers": [b"h" * 4096] * 3})  # longer than its buffer
TRAILER = pack_frame({"ok": True, "valid": True})


@pytest.mark.parametrize("reply", [SHORT, LONG], ids=["short reply", "long reply"])
@pytest.mark.parametrize(
    "cuts",  # where the sender splits the answer, given the reply's length
    [
        lambda r: [],  # all at once: the reply, the payload's start and the trailer together
        lambda r: [1, 3],  # the length prefix in pieces
        lambda r: [r - 1],  # the reply's last byte alone
        lambda r: [r + 10, r + len(PAYLOAD) + 2],  # the trailer's prefix split
        lambda r: [r + len(PAYLOAD)],  # the trailer alone after the payload
    ],
    ids=["whole", "prefix split", "reply split", "trailer split", "trailer alone"],
)
def test_every_split_of_the_answer_reads_the_same(reply: bytes, cuts: Callable[[int], list[int]]) -> None:
    first, second = socket.socketpair()
    with first, second:
        sender = _answer(second, _split(reply + PAYLOAD + TRAILER, cuts(len(reply))), 0.01)
        got_reply, payload, trailer, drained = asyncio.run(_read(first, [1000, len(PAYLOAD) - 1000]))
        sender.join()
        assert second.recv(64) == b"request"
    assert got_reply == {"ok": True, "headers": [b"h" * 4096] * (1 if reply is SHORT else 3)}
    assert payload == PAYLOAD
    assert trailer == {"ok": True, "valid": True}
    assert drained


def test_bytes_past_the_answer_are_left_over() -> None:
    first, second = socket.socketpair()
    with first, second:
        second.sendall(SHORT + PAYLOAD + TRAILER + b"junk")
        *_, drained = asyncio.run(_read(first, [len(PAYLOAD)]))
    assert not drained


def test_a_peer_gone_mid_payload_is_a_closed_connection() -> None:
    first, second = socket.socketpair()

    def answer_part_then_close() -> None:
        second.recv(64)
        second.sendall(SHORT + PAYLOAD[:5000])
        second.close()

    with first:
        peer = threading.Thread(target=answer_part_then_close, daemon=True)
        peer.start()
        with pytest.raises(ConnectionClosed):
            asyncio.run(_read(first, [len(PAYLOAD)]))
        peer.join()


def test_a_peer_that_never_answers_costs_the_timeout() -> None:
    first, second = socket.socketpair()
    with first, second:
        second.sendall(SHORT[:100])  # part of the reply, then silence
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            asyncio.run(_read(first, [len(PAYLOAD)], timeout_seconds=0.3))
        assert time.monotonic() - began < 3
