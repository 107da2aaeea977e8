"""The data plane's C read path (data_plane_reads.c) with real daemon processes: what it
sends is what the Python path sends, a chunk is answered in C from its first read once
committed or promoted to DRAM and never from a place it left, a chunk that leaves its
blocks under a C send is reported invalid, and connections that stall, vanish or send
garbage after C answered them cost nothing."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_probes import free_port, scrape_metrics

from attnstore.chunks.format import decode_layout
from attnstore.data_plane_wire import pack_frame, recv_exactly_into, recv_frame
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client import KVStoreClient, Tier

if TYPE_CHECKING:
    from conftest import ChunkSet, DaemonFactory, DaemonProcess, PollUntil

NAMESPACE = b"data-plane-c-rd!"
C_READS = "attnstore_kvstore_data_plane_c_reads_total"


def _daemon(factory: DaemonFactory, c_reads: bool = True, **settings: object) -> DaemonProcess:
    return factory(DATA_PLANE_PORT=free_port(), METRICS_PORT=0, DATA_PLANE_C_READS=c_reads, **settings)


def _c_reads(daemon: DaemonProcess) -> int:
    return int(scrape_metrics(daemon.metrics_port).get(C_READS, 0))


def _open_port(daemon: DaemonProcess) -> int:
    with grpc.insecure_channel(daemon.address) as channel:
        return int(
            kvstore_pb2_grpc.KVStoreStub(channel).OpenDataPlane(kvstore_pb2.OpenDataPlaneRequest()).port
        )


def _connect(port: int, receive_buffer_bytes: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    if receive_buffer_bytes:  # a small window: the daemon's send stalls until read
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    sock.connect(("127.0.0.1", port))
    sock.sendall(pack_frame({"op": "hello", "token": None}))
    assert recv_frame(sock, 1 << 20) == {"ok": True}
    return sock


def _request(keys: list[bytes], start: int = 0, end: int = 0, namespace: bytes = NAMESPACE) -> dict[str, Any]:
    return {
        "op": "get",
        "namespace": namespace,
        "keys": keys,
        "layer_start": start,
        "layer_end": end,
        "unheld": True,
    }


def _read(sock: socket.socket, request: dict[str, Any]) -> tuple[dict[str, Any], bytes, dict[str, Any]]:
    """One unheld read on `sock`: its reply, payload and trailer ({} for a read the daemon
    sent held: no trailer follows)."""
    sock.sendall(pack_frame(request))
    reply = recv_frame(sock, 1 << 20)
    assert reply["ok"] is True, reply
    end = request["layer_end"]
    total = 0
    for header in reply["headers"]:
        layout = decode_layout(header)
        first, last = layout.layer_span(request["layer_start"], end or layout.header.num_layers)
        total += last - first
    payload = bytearray(total)
    recv_exactly_into(sock, memoryview(payload))
    return reply, bytes(payload), recv_frame(sock, 1 << 20) if reply.get("trailer") else {}


def _huge(chunk_set: type[ChunkSet], seed: int, namespace: bytes = NAMESPACE) -> ChunkSet:
    """Chunks of 12.6 MB: the send of one stalls beyond both socket buffers while its
    reader holds back."""
    return chunk_set(namespace, num_layers=8, kv_heads=4, head_dim=128, chunk_tokens=768, seed=seed)


def _registered_huge(
    daemon: DaemonProcess, chunk_set: type[ChunkSet], seed: int, count: int
) -> tuple[ChunkSet, dict[str, Any], socket.socket]:
    """`count` 12.6 MB chunks stored on `daemon`, the unheld read of the first, and a
    connection that made it once (C's read: the chunk entered C's table at its commit)."""
    huge = _huge(chunk_set, seed)
    with KVStoreClient(daemon.address, use_shm=False) as client:
        huge.register(client)
        client.put_chunks(NAMESPACE, huge.items(0, count))
    request = _request(huge.keys(0, 1))
    reader = _connect(_open_port(daemon))
    assert _read(reader, request)[2] == {"ok": True, "valid": True}
    return huge, request, reader


def _stalled_read(port: int, request: dict[str, Any]) -> tuple[socket.socket, dict[str, Any]]:
    """A read whose reader takes the reply and then holds back: the send stalls."""
    sock = _connect(port, receive_buffer_bytes=4096)
    sock.sendall(pack_frame(request))
    reply = recv_frame(sock, 1 << 20)
    assert reply["trailer"] is True
    return sock, reply


SHAPES = [
    pytest.param(0, 1, 0, 0, id="whole chunk"),
    pytest.param(2, 3, 3, 6, id="one chunk's layers 3-6"),
    pytest.param(1, 4, 0, 0, id="three chunks, layer-major"),
    pytest.param(0, 4, 7, 8, id="four chunks, last layer"),
    pytest.param(0, 20, 1, 3, id="twenty chunks (array16 of headers)"),
]


@pytest.mark.parametrize(("first", "last", "start", "end"), SHAPES)
def test_c_sends_what_the_python_path_sends(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil,
    first: int, last: int, start: int, end: int,
) -> None:  # fmt: skip
    """The same reads from a daemon with the C path and one without: both reads of a chunk
    are C's on one (it entered the table at its commit), Python's on the other; replies,
    payloads and trailers agree, and the C daemon counted its sends."""
    made = chunk_set(NAMESPACE, num_layers=8, seed=11)
    answers = {}
    for c_reads in (True, False):
        daemon = _daemon(daemon_factory, c_reads)
        with KVStoreClient(daemon.address, use_shm=False) as client:
            made.register(client)
            client.put_chunks(NAMESPACE, made.items(0, 20))
        sock = _connect(_open_port(daemon))
        request = _request(made.keys(first, last), start, end)
        answers[c_reads] = [_read(sock, request), _read(sock, request)]
        sent = 2 * (last - first) if c_reads else 0
        poll_until(lambda d=daemon, n=sent: _c_reads(d) == n, what=f"{sent} chunks sent from C")  # type: ignore[misc]
        sock.close()
    assert answers[True] == answers[False]
    reply, payload, trailer = answers[True][1]
    assert trailer == {"ok": True, "valid": True} and reply["trailer"] is True
    expected = b"".join(
        made.data(index)[slice(*decode_layout(made.data(index)).layer_span(layer, layer + 1))]
        for layer in range(start, end or 8)
        for index in range(first, last)
    )
    assert payload == expected


def test_c_reads_pass_the_clients_checksums_and_count_as_hits(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    made = chunk_set(NAMESPACE, num_layers=4, seed=12)
    daemon = _daemon(daemon_factory)
    with KVStoreClient(daemon.address, use_shm=False, verify_checksums=True) as client:
        made.register(client)
        client.put_chunks(NAMESPACE, made.items(0, 6))
        before = client.stats().dram.hits
        for _ in range(10):
            assert client.get_whole_chunks(NAMESPACE, made.keys(0, 6)) == [made.data(i) for i in range(6)]
        poll_until(lambda: _c_reads(daemon) == 60, what="every read sent from C")
        poll_until(lambda: client.stats().dram.hits - before == 60, what="60 hits noted")


def test_without_a_compiler_python_serves_every_read(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    made = chunk_set(NAMESPACE, num_layers=4, seed=17)
    daemon = _daemon(daemon_factory)
    with KVStoreClient(daemon.address, use_shm=False) as client:
        made.register(client)
        client.put_chunks(NAMESPACE, made.items(0, 2))
        for _ in range(3):
            assert client.get_whole_chunks(NAMESPACE, made.keys(0, 2)) == [made.data(0), made.data(1)]
    assert _c_reads(daemon) == 0
    assert "data_plane_c_reads" in daemon.log_tail() and "no-such-compiler" in daemon.log_tail()


def test_chunks_enter_c_at_commit_and_promotion_and_leave_before_their_blocks_are_reused(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    """A chunk's first read is C's once committed to DRAM; evicted to SSD and its blocks
    taken by other chunks, it is read by Python (which promotes it) with its own bytes,
    never the blocks' new owners'; promoted, its next read is C's again."""
    made = chunk_set(NAMESPACE, num_layers=4, seed=18)  # 20 KiB chunks: one 128 KiB block each
    daemon = _daemon(daemon_factory, DRAM_CAPACITY_BYTES=1024 * 1024, DRAM_BLOCK_BYTES=128 * 1024,
                     MAX_CHUNK_BYTES=128 * 1024, EVICTION_POLICY="lru")  # fmt: skip
    sock = _connect(_open_port(daemon))
    body = len(made.data(0)) - decode_layout(made.data(0)).data_offset
    with KVStoreClient(daemon.address, use_shm=False) as client:
        made.register(client)
        client.put_chunks(NAMESPACE, made.items(0, 4))
        assert _read(sock, _request(made.keys(0, 4)))[2] == {"ok": True, "valid": True}
        poll_until(lambda: _c_reads(daemon) == 4, what="the first read of four chunks sent from C")

        client.put_chunks(NAMESPACE, made.items(4, 12))  # eight blocks: chunks 0-3 go to SSD
        assert made.tiers(client, range(4)) == [Tier.SSD] * 4
        # Python's (held: it promotes the chunk), then C's (it entered the table at promotion)
        for trailer in ({}, {"ok": True, "valid": True}):
            assert _read(sock, _request(made.keys(0, 1)))[1:] == (made.data(0)[-body:], trailer)
        poll_until(lambda: _c_reads(daemon) == 5, what="the promoted chunk's second read sent from C")
        assert made.tiers(client, [0]) == [Tier.DRAM]
    sock.close()


def test_a_chunk_that_leaves_its_blocks_under_a_c_send_is_reported_invalid(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    """A 12.6 MB chunk read once (registered), then read again from C by a reader that holds
    back, so the send stalls beyond both socket buffers; the chunk is deleted and its blocks
    taken by other chunks meanwhile: the trailer says invalid (the reader must not keep the
    bytes), later reads are Python's (NotFound), and a chunk stored again under the key is
    read with its new bytes."""
    daemon = _daemon(daemon_factory, DRAM_CAPACITY_BYTES=32 * 1024 * 1024)
    port = _open_port(daemon)
    huge, request, warm = _registered_huge(daemon, chunk_set, seed=13, count=1)
    with KVStoreClient(daemon.address, use_shm=False) as client:
        stalled, reply = _stalled_read(port, request)
        assert client.delete(NAMESPACE, huge.keys(0, 1)) == 1  # while the C send is stalled
        others = _huge(chunk_set, seed=14, namespace=b"data-plane-c-rd2")
        others.register(client)
        poll_until(lambda: len(client.put_chunks(others.namespace, others.items(0, 2)).stored) == 2,
                   what="other chunks in DRAM")  # fmt: skip
        layout = decode_layout(reply["headers"][0])
        recv_exactly_into(stalled, memoryview(bytearray(layout.total_bytes - layout.data_offset)))
        assert recv_frame(stalled, 1 << 20) == {"ok": True, "valid": False}
        poll_until(lambda: _c_reads(daemon) == 2, what="the first read and the stalled one counted as C's")

        warm.sendall(pack_frame(request))  # its entry dropped: Python answers, and refuses
        assert recv_frame(warm, 1 << 20)["code"] == "NotFound"
        renewed = huge.data(0, version=1)
        poll_until(lambda: client.put_chunks(NAMESPACE, {huge.key(0): renewed}).stored, what="stored again")
        again = _connect(port)
        for _ in range(2):  # C's both: the renewed chunk entered the table at its commit
            _, payload, trailer = _read(again, request)
            assert trailer == {"ok": True, "valid": True}
            assert payload == renewed[layout.data_offset :] != huge.data(0)[layout.data_offset :]
        poll_until(lambda: _c_reads(daemon) == 4, what="the renewed chunk's reads sent from C")


def test_connections_that_stall_vanish_or_send_garbage_after_c_cost_nothing(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    """After C answered them: a reader that stops reading a stalled send is cut after the
    idle timeout, one that resets mid-payload is forgotten, one that sends garbage is
    refused by Python as before; readers beside them are served from C throughout, no
    lease is left, and the daemon stops cleanly with a send still stalled."""
    daemon = _daemon(daemon_factory, DATA_PLANE_IDLE_TIMEOUT_SECONDS=1.0)
    port = _open_port(daemon)
    huge, request, reader = _registered_huge(daemon, chunk_set, seed=15, count=2)
    with KVStoreClient(daemon.address, use_shm=False) as client:
        stalled, _ = _stalled_read(port, request)
        vanished = _connect(port, receive_buffer_bytes=4096)
        vanished.sendall(pack_frame(request))
        vanished.recv(5000)
        vanished.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not FIN
        vanished.close()
        garbage = _connect(port)
        assert _read(garbage, request)[2]["valid"] is True
        garbage.sendall(struct.pack("!I", 3) + b"\xc1\xc1\xc1")
        assert recv_frame(garbage, 1 << 20)["code"] == "InvalidArgument"
        assert garbage.recv(1) == b""

        for _ in range(3):  # served beside them
            assert _read(reader, request)[1] == huge.data(0)[decode_layout(huge.data(0)).data_offset :]
        # completed sends only: the first, the garbage sender's and these three (not the cut ones)
        poll_until(lambda: _c_reads(daemon) == 5, what="the completed reads sent from C")
        received = 0
        try:  # the stalled send was cut after the idle timeout: its rest never comes
            while chunk := stalled.recv(1 << 20):
                received += len(chunk)
        except OSError:
            pass
        assert received < len(huge.data(0))
        assert client.stats().leases == 0

    stalled_at_stop, _ = _stalled_read(port, request)
    with stalled_at_stop:  # still stalled while the daemon stops
        assert daemon.stop() == 0


# ---- fuzzed requests, with the C path and without: the same bytes back ----------------------

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FUZZ_CHUNKS = 3


@pytest.fixture(scope="module")
def twin_daemons(
    module_daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> tuple[int, int, ChunkSet]:
    """The data-plane ports of a daemon with the C path (every chunk registered by a first
    read) and one without, holding the same chunks."""
    made = chunk_set(NAMESPACE, num_layers=4, seed=16)
    ports = []
    for c_reads in (True, False):
        daemon = module_daemon_factory(DATA_PLANE_PORT=free_port(), DATA_PLANE_C_READS=c_reads,
                                       DATA_PLANE_IDLE_TIMEOUT_SECONDS=2.0)  # fmt: skip
        with KVStoreClient(daemon.address, use_shm=False) as client:
            made.register(client)
            client.put_chunks(NAMESPACE, made.items(0, FUZZ_CHUNKS))
        ports.append(_open_port(daemon))
        with _connect(ports[-1]) as sock:
            assert _read(sock, _request(made.keys(0, FUZZ_CHUNKS)))[2]["valid"] is True
    return ports[0], ports[1], made


def _answer(port: int, frames: bytes) -> bytes:
    """Everything the daemon sends back for `frames` until it closes (the client sends
    nothing more)."""
    with _connect(port) as sock:
        sock.sendall(frames)
        sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        while chunk := sock.recv(1 << 20):
            received += chunk
        return bytes(received)


_field = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**33), 2**33),
    st.binary(max_size=20),
    st.text(max_size=8),
    st.lists(st.binary(min_size=31, max_size=33), max_size=3),
)


@st.composite
def _requests(draw: st.DrawFn, keys: list[bytes]) -> bytes:
    """A valid unheld read of registered chunks (any layer range, some out of range), as is
    (half the time) or with one change: fields replaced, dropped or added, keys repeated or
    unknown, the packed frame cut or a bit flipped."""
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=len(keys), unique=True))
    request: dict[str, Any] = _request(chosen, draw(st.integers(0, 4)), draw(st.integers(0, 5)))
    change = draw(st.sampled_from(["none", "none", "none", "field", "keys", "cut", "flip"]))
    if change == "field":
        name = draw(st.sampled_from([*request, "lease", "extra"]))
        if draw(st.booleans()):
            request[name] = draw(_field)
        else:
            request.pop(name, None)
    elif change == "keys":
        request["keys"] = [*chosen, draw(st.sampled_from([chosen[0], b"\x05" * 32, b"\x05"]))]
    frame = bytearray(pack_frame(request))
    if change == "flip":
        frame[draw(st.integers(4, len(frame) - 1))] ^= 1 << draw(st.integers(0, 7))
    return bytes(frame[: draw(st.integers(4, len(frame) - 1))] if change == "cut" else frame)


@FUZZ
@given(data=st.data())
def test_fuzzed_reads_get_the_same_answer_with_the_c_path_and_without(
    twin_daemons: tuple[int, int, ChunkSet], data: st.DataObject
) -> None:
    """Byte for byte: a read C serves answers as Python's would, and whatever C does not
    serve it hands to Python unread (so refusals are the same too)."""
    with_c, without_c, made = twin_daemons
    frames = data.draw(_requests(made.keys(0, FUZZ_CHUNKS)))
    assert _answer(with_c, frames) == _answer(without_c, frames)
