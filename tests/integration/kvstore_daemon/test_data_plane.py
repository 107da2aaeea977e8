"""The data plane with a real daemon process: byte-identical reads of whole chunks and of
layer ranges, writes, concurrent readers, and the transport the client picks. Raw-socket
clients check what a broken or hostile connection costs (nothing, and no lease)."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc
import msgpack
import pytest
from service_probes import free_port

from attnstore.chunks.format import decode_layout
from attnstore.data_plane_wire import pack_frame, recv_exactly_into, recv_frame
from attnstore.errors import InvalidArgument
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client import AsyncKVStoreClient, KVStoreClient
from attnstore.kvstore_client.data_plane import PlaceStream, TcpDataPlane

if TYPE_CHECKING:
    from conftest import ChunkSet, DaemonFactory, DaemonProcess, PollUntil

NAMESPACE = b"data-plane-tests"


@pytest.fixture(scope="module")
def daemon(module_daemon_factory: DaemonFactory) -> DaemonProcess:
    return module_daemon_factory(DATA_PLANE_PORT=free_port(), LEASE_TTL_SECONDS=1.0)


@pytest.fixture(scope="module")
def chunks(chunk_set: type[ChunkSet], daemon: DaemonProcess) -> ChunkSet:
    """Eight chunks of 8 layers stored through the data plane."""
    made = chunk_set(NAMESPACE, num_layers=8, seed=7)
    with KVStoreClient(daemon.address, use_shm=False) as client:
        made.register(client)
        assert len(client.put_chunks(NAMESPACE, made.items(0, 8)).stored) == 8
        assert client.client_stats().writes == {"dataplane": 1}
    return made


@pytest.fixture(scope="module")
def stub(daemon: DaemonProcess) -> Iterator[kvstore_pb2_grpc.KVStoreStub]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield kvstore_pb2_grpc.KVStoreStub(channel)


def _port(stub: kvstore_pb2_grpc.KVStoreStub) -> int:
    return stub.OpenDataPlane(kvstore_pb2.OpenDataPlaneRequest()).port


def test_whole_chunks_and_layer_ranges_are_byte_identical(daemon: DaemonProcess, chunks: ChunkSet) -> None:
    keys = chunks.keys(0, 8)
    with KVStoreClient(daemon.address, use_shm=False) as client:
        assert client.transport() == "dataplane"
        assert client.get_whole_chunks(NAMESPACE, keys) == [chunks.data(i) for i in range(8)]
        for start, end in [(0, 1), (3, 6), (7, 8), (0, 0)]:
            for index, got in enumerate(
                client.get_chunks(NAMESPACE, keys[2:5], layer_start=start, layer_end=end)
            ):
                whole = chunks.data(index + 2)
                first, last = decode_layout(whole).layer_span(start, end or 8)
                assert bytes(got.data) == whole[first:last]
        pieces = client.iter_layers(NAMESPACE, keys[:2], layer_start=1, layer_end=3)
        assert [(p.chunk_index, p.layer) for p in pieces] == [(0, 1), (1, 1), (0, 2), (1, 2)]  # layer-major
        for piece in pieces:
            first, last = piece.layout.layer_span(piece.layer, piece.layer + 1)
            assert bytes(piece.data) == chunks.data(piece.chunk_index)[first:last]
        stats = client.client_stats()
        assert stats.transport == "dataplane" and stats.reads == {"dataplane": 6}
        assert client.stats().leases == 0  # the daemon ended every lease after sending


def test_concurrent_readers_each_get_their_own_bytes(daemon: DaemonProcess, chunks: ChunkSet) -> None:
    """Small chunks: read side by side on the client's event loop."""
    assert _read_side_by_side(daemon, chunks, 8, 32) == [[chunks.data(i % 8)] for i in range(32)]


def test_concurrent_readers_of_large_chunks_each_get_their_own_bytes(
    daemon: DaemonProcess, chunk_set: type[ChunkSet]
) -> None:
    """Chunks over 1 MiB (2 MiB here): read side by side in the client's threads."""
    large = chunk_set(b"data-plane-large", num_layers=8, kv_heads=4, head_dim=128, chunk_tokens=128, seed=8)
    with KVStoreClient(daemon.address, use_shm=False) as client:
        large.register(client)
        assert len(client.put_chunks(large.namespace, large.items(0, 4)).stored) == 4
    assert _read_side_by_side(daemon, large, 4, 12) == [[large.data(i % 4)] for i in range(12)]


def _read_side_by_side(daemon: DaemonProcess, chunks: ChunkSet, count: int, reads: int) -> list[list[bytes]]:
    async def read_all() -> list[list[bytes]]:
        async with AsyncKVStoreClient(daemon.address, use_shm=False) as client:
            await client.get_whole_chunks(chunks.namespace, chunks.keys(0, 1))  # the client learns the size
            keys = [chunks.keys(i % count, i % count + 1) for i in range(reads)]
            return await asyncio.gather(*(client.get_whole_chunks(chunks.namespace, some) for some in keys))

    return asyncio.run(read_all())


def test_the_blocking_client_reads_into_buffers_in_its_callers_threads(
    daemon: DaemonProcess, chunks: ChunkSet
) -> None:
    """Over the data plane, KVStoreClient.get_chunks_into reads in the calling thread (no
    hop to the client's loop) once the first call chose the transport: threads reading at
    once each get their own bytes, and a buffer too small is refused without harm."""

    def into(client: KVStoreClient, index: int) -> bytes:
        out = memoryview(bytearray(len(chunks.data(index))))
        client.get_chunks_into(NAMESPACE, [chunks.key(index)], [out])
        return bytes(out)

    with KVStoreClient(daemon.address, use_shm=False) as client:
        assert into(client, 0) == chunks.data(0)  # on the loop: it opens the data plane
        direct = memoryview(bytearray(len(chunks.data(1))))
        assert client.aio.get_chunks_into_blocking(NAMESPACE, [chunks.key(1)], [direct]) is not None
        assert bytes(direct) == chunks.data(1)
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(lambda i: into(client, i % 8), range(16))) == [
                chunks.data(i % 8) for i in range(16)
            ]
        with pytest.raises(InvalidArgument, match="output buffer 0 holds 10 bytes"):
            client.get_chunks_into(NAMESPACE, [chunks.key(2)], [memoryview(bytearray(10))])
        assert into(client, 2) == chunks.data(2)
        assert client.client_stats().reads == {"dataplane": 20}
        assert client.stats().leases == 0


def test_unheld_reads_count_as_hits_once_the_daemon_notes_them(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    """An unheld read's hits reach the event loop in batches (not one wake-up per read):
    every read of a burst is counted, whichever batch took it."""
    made = chunk_set(NAMESPACE, num_layers=2, seed=3)
    with KVStoreClient(daemon_factory(DATA_PLANE_PORT=free_port()).address, use_shm=False) as client:
        made.register(client)
        client.put_chunks(NAMESPACE, made.items(0, 4))
        before = client.stats().dram.hits
        for round_ in range(25):
            assert client.get_whole_chunks(NAMESPACE, made.keys(0, 4)) == [made.data(i) for i in range(4)], (
                round_
            )
        poll_until(lambda: client.stats().dram.hits - before == 100, what="100 hits noted")
        assert client.client_stats().reads == {"dataplane": 25}


def test_a_missing_chunk_is_not_found_and_the_client_keeps_working(
    daemon: DaemonProcess, chunks: ChunkSet
) -> None:
    with KVStoreClient(daemon.address, use_shm=False) as client:
        with pytest.raises(Exception, match="not stored"):
            client.get_whole_chunks(NAMESPACE, [chunks.key(0), b"\x01" * 32])
        assert client.get_whole_chunks(NAMESPACE, [chunks.key(1)]) == [chunks.data(1)]


def test_without_a_data_plane_the_client_uses_grpc(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    plain = daemon_factory()
    made = chunk_set(NAMESPACE, num_layers=2)
    with KVStoreClient(plain.address, use_shm=False) as client:
        made.register(client)
        client.put_chunks(NAMESPACE, made.items(0, 2))
        assert client.get_whole_chunks(NAMESPACE, made.keys(0, 2)) == [made.data(0), made.data(1)]
        assert client.client_stats().transport == "grpc"
    with KVStoreClient(plain.address) as client:
        assert client.transport() == "shm"


# ---- raw connections ---------------------------------------------------------------------------


def _connect(port: int, receive_buffer_bytes: int = 0) -> socket.socket:
    """`receive_buffer_bytes`: a small window, so the daemon's send stalls until read."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(5)
    if receive_buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    sock.connect(("127.0.0.1", port))
    sock.sendall(pack_frame({"op": "hello", "token": None}))
    assert recv_frame(sock, 1 << 20) == {"ok": True}
    return sock


def _lease(stub: kvstore_pb2_grpc.KVStoreStub, keys: list[bytes], ttl_seconds: int) -> int:
    request = kvstore_pb2.GetShmRequest(namespace=NAMESPACE, keys=keys, lease_ttl_seconds=ttl_seconds)
    return stub.GetShm(request).lease_id


def _leases(stub: kvstore_pb2_grpc.KVStoreStub) -> int:
    return stub.Stats(kvstore_pb2.StatsRequest()).leases


def _get(lease_id: int, **overrides: object) -> bytes:
    request = {"op": "get", "namespace": NAMESPACE, "lease": lease_id, "chunks": [0], "layer_start": 0,
               "layer_end": 0, "release": True} | overrides  # fmt: skip
    return pack_frame(request)


def test_a_reader_that_disconnects_mid_transfer_leaves_no_lease(
    stub: kvstore_pb2_grpc.KVStoreStub, chunks: ChunkSet, poll_until: PollUntil
) -> None:
    port = _port(stub)
    for cut_after in (0, 1, 5000):
        lease = _lease(stub, chunks.keys(0, 4), ttl_seconds=60)
        sock = _connect(port)
        sock.sendall(_get(lease, chunks=[0, 1, 2, 3]))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not FIN
        if cut_after:
            sock.recv(cut_after)
        sock.close()
        poll_until(lambda: _leases(stub) == 0, what="the cut reader's lease ends")


def test_an_expired_lease_is_refused(
    stub: kvstore_pb2_grpc.KVStoreStub, chunks: ChunkSet, poll_until: PollUntil
) -> None:
    lease = _lease(stub, chunks.keys(0, 1), ttl_seconds=1)
    poll_until(lambda: _leases(stub) == 0, what="the lease expires")
    sock = _connect(_port(stub))
    sock.sendall(_get(lease))
    reply = recv_frame(sock, 1 << 20)
    assert reply["ok"] is False and reply["code"] == "NotFound"
    assert sock.recv(1) == b""  # closed after the refusal


def test_a_lease_cannot_be_read_under_another_namespace(
    stub: kvstore_pb2_grpc.KVStoreStub, chunks: ChunkSet
) -> None:
    lease = _lease(stub, chunks.keys(0, 1), ttl_seconds=60)
    sock = _connect(_port(stub))
    sock.sendall(_get(lease, namespace=b"another-tenant!!"))
    assert recv_frame(sock, 1 << 20)["code"] == "NotFound"  # as if there were no such lease


REFUSALS: list[tuple[str, Callable[[int], bytes]]] = [
    ("huge length", lambda lease: struct.pack("!I", 1 << 31)),
    ("not msgpack", lambda lease: struct.pack("!I", 3) + b"\xc1\xc1\xc1"),
    ("not a map", lambda lease: pack_frame([1, 2])),  # type: ignore[arg-type]
    ("unknown op", lambda lease: pack_frame({"op": "steal"})),
    ("lease not an int", lambda lease: _get(lease, lease="1")),
    ("chunk out of range", lambda lease: _get(lease, chunks=[5])),
    ("no chunks", lambda lease: _get(lease, chunks=[])),
    ("layers out of range", lambda lease: _get(lease, layer_start=3, layer_end=99)),
    ("keys not bytes", lambda lease: _get(lease, keys=[1, 2])),
    ("a key not stored", lambda lease: _get(lease, keys=[b"\x07" * 32])),
    ("a short key", lambda lease: _get(lease, keys=[b"\x07" * 3])),
    (
        "put of an unknown write",
        lambda lease: pack_frame({"op": "put", "namespace": NAMESPACE, "writes": [[1, 10]]}),
    ),
    (
        "put of a bad list",
        lambda lease: pack_frame({"op": "put", "namespace": NAMESPACE, "writes": [[1, -1]]}),
    ),
]


@pytest.mark.parametrize("build", [b for _, b in REFUSALS], ids=[name for name, _ in REFUSALS])
def test_malformed_requests_are_refused_and_close_the_connection(
    daemon: DaemonProcess, stub: kvstore_pb2_grpc.KVStoreStub, chunks: ChunkSet, build: Callable[[int], bytes]
) -> None:
    lease = _lease(stub, chunks.keys(0, 1), ttl_seconds=60)
    sock = _connect(_port(stub))
    sock.sendall(build(lease))
    reply = sock.recv(1 << 16)
    if reply:
        (length,) = struct.unpack("!I", reply[:4])
        refusal = msgpack.unpackb(reply[4 : 4 + length])
        assert refusal["ok"] is False and refusal["code"] in ("InvalidArgument", "NotFound", "OutOfRange")
        assert sock.recv(1) == b""
    with KVStoreClient(daemon.address, use_shm=False) as client:  # still serving
        assert client.get_whole_chunks(NAMESPACE, chunks.keys(0, 1)) == [chunks.data(0)]
    stub.ReleaseLease(kvstore_pb2.ReleaseLeaseRequest(lease_ids=[lease]))


def test_a_writer_cut_mid_payload_stores_nothing(
    stub: kvstore_pb2_grpc.KVStoreStub, chunks: ChunkSet, chunk_set: type[ChunkSet]
) -> None:
    made = chunk_set(NAMESPACE, num_layers=8, seed=99)  # `chunks` registered the namespace
    data = made.data(20)
    reply = stub.ReservePut(kvstore_pb2.ReservePutRequest(
        namespace=NAMESPACE, items=[kvstore_pb2.PutItem(key=made.key(20), size_bytes=len(data))]))  # fmt: skip
    write_id = reply.reservations[0].write_id
    sock = _connect(_port(stub))
    sock.sendall(
        pack_frame({"op": "put", "namespace": NAMESPACE, "writes": [[write_id, len(data)]]}) + data[:1000]
    )
    sock.close()
    with pytest.raises(grpc.RpcError) as refused:  # the half-written chunk fails its checks
        stub.CommitPut(kvstore_pb2.CommitPutRequest(write_ids=[write_id]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stub.AbortPut(kvstore_pb2.AbortPutRequest(write_ids=[write_id])).aborted_count == 1
    assert stub.Lookup(kvstore_pb2.LookupRequest(namespace=NAMESPACE, keys=[made.key(20)])).prefix_length == 0


def _recv_chunk_layers(sock: socket.socket, header: bytes) -> bytes:
    """The payload of a whole-chunk read that sent `header`: every layer."""
    layout = decode_layout(header)
    payload = bytearray(layout.total_bytes - layout.data_offset)
    recv_exactly_into(sock, memoryview(payload))
    return bytes(payload)


def test_an_unheld_read_says_after_its_bytes_whether_they_stayed_put(
    daemon: DaemonProcess, stub: kvstore_pb2_grpc.KVStoreStub, chunks: ChunkSet, chunk_set: type[ChunkSet]
) -> None:
    """`unheld`: the daemon sends DRAM chunks without holding them and a trailer says whether
    they kept their blocks. A chunk deleted while its bytes are in flight (the reader holds
    back, so the send of 12.6 MB stalls beyond both socket buffers) is reported invalid."""
    port = _port(stub)
    sock = _connect(port)
    request = {
        "op": "get",
        "namespace": NAMESPACE,
        "keys": chunks.keys(0, 1),
        "layer_start": 0,
        "layer_end": 0,
    }
    sock.sendall(pack_frame(request | {"unheld": True}))
    reply = recv_frame(sock, 1 << 20)
    assert reply["trailer"] is True
    data = chunks.data(0)
    assert _recv_chunk_layers(sock, reply["headers"][0]) == data[decode_layout(data).data_offset :]
    assert recv_frame(sock, 1 << 20) == {"ok": True, "valid": True}
    sock.sendall(pack_frame(request))  # the same connection serves on; held, without a trailer
    reply = recv_frame(sock, 1 << 20)
    assert "trailer" not in reply and _recv_chunk_layers(sock, reply["headers"][0]) == data[4096:]
    sock.sendall(pack_frame(request | {"unheld": 1}))
    assert recv_frame(sock, 1 << 20)["code"] == "InvalidArgument"
    assert sock.recv(1) == b""

    huge = chunk_set(b"data-plane-huge!", num_layers=8, kv_heads=4, head_dim=128, chunk_tokens=768, seed=5)
    with KVStoreClient(daemon.address, use_shm=False) as client:
        huge.register(client)
        client.put_chunks(huge.namespace, huge.items(0, 1))
        sock = _connect(port, receive_buffer_bytes=4096)
        sock.sendall(
            pack_frame(request | {"namespace": huge.namespace, "keys": huge.keys(0, 1), "unheld": True})
        )
        reply = recv_frame(sock, 1 << 20)
        assert reply["trailer"] is True
        assert client.delete(huge.namespace, huge.keys(0, 1)) == 1  # while the send is stalled
        _recv_chunk_layers(sock, reply["headers"][0])
        assert recv_frame(sock, 1 << 20) == {"ok": True, "valid": False}
        assert client.lookup(huge.namespace, huge.keys(0, 1)).prefix_length == 0


def _read_blocking(plane: TcpDataPlane, namespace: bytes, keys: list[bytes], place: PlaceStream) -> None:
    plane.read_into_blocking(namespace, keys, 0, 0, place)


def _read_from_a_loop(plane: TcpDataPlane, namespace: bytes, keys: list[bytes], place: PlaceStream) -> None:
    """The async client's whole reads: driven from the event loop (the payload of a first read
    over 4 MiB, as here, is received in a thread)."""
    asyncio.run(plane.read_into(namespace, keys, 0, 0, place))


def _read_from_a_loop_size_known(
    plane: TcpDataPlane, namespace: bytes, keys: list[bytes], place: PlaceStream
) -> None:
    """The same once the client knows the payload is over 4 MiB (a read of it before): the
    whole read is one trip to a thread, where `place` is called too."""
    first = True

    def place_after_one_read(headers: list[bytes]) -> list[memoryview]:
        nonlocal first
        if first:  # the read that teaches the size, into a scratch buffer
            first = False
            layout = decode_layout(headers[0])
            return [memoryview(bytearray(layout.total_bytes))[layout.data_offset :]]
        assert threading.current_thread() is not threading.main_thread()
        return place(headers)

    async def two_reads() -> None:
        for _ in range(2):
            await plane.read_into(namespace, keys, 0, 0, place_after_one_read)

    asyncio.run(two_reads())


READS = {
    "blocking": _read_blocking,
    "from a loop": _read_from_a_loop,
    "from a loop, size known": _read_from_a_loop_size_known,
}


@pytest.mark.parametrize("read", list(READS.values()), ids=list(READS))
def test_a_read_whose_chunk_moves_under_its_unheld_send_is_asked_again_held(
    daemon: DaemonProcess, stub: kvstore_pb2_grpc.KVStoreStub, chunk_set: type[ChunkSet], poll_until: PollUntil,
    read: Callable[[TcpDataPlane, bytes, list[bytes], PlaceStream], None],
) -> None:  # fmt: skip
    """The client's side of the trailer: while its buffers are being picked (the send of
    12.6 MB stalls meanwhile), the chunk is deleted and stored again in other blocks; the
    unheld send says invalid, and the client's second, held read places the bytes again."""
    moved = chunk_set(b"data-plane-move!", num_layers=8, kv_heads=4, head_dim=128, chunk_tokens=768, seed=6)
    data = moved.data(0)
    out = bytearray(len(data))
    placed: list[list[bytes]] = []
    with KVStoreClient(daemon.address, use_shm=False) as client:
        moved.register(client)
        client.put_chunks(moved.namespace, moved.items(0, 1))

        def place(headers: list[bytes]) -> list[memoryview]:
            if not placed:  # the first, unheld send: its chunk moves under it
                assert client.delete(moved.namespace, moved.keys(0, 1)) == 1
                # stored again once the deleted copy's last reader (its SSD write) is done
                poll_until(
                    lambda: client.put_chunks(moved.namespace, moved.items(0, 1)).stored, what="stored again"
                )
            placed.append(headers)
            return [memoryview(out)[decode_layout(headers[0]).data_offset :]]

        plane = TcpDataPlane("127.0.0.1", _port(stub), ssl_context=None, server_hostname=None, token=None,
                             timeout_seconds=10)  # fmt: skip
        try:
            read(plane, moved.namespace, moved.keys(0, 1), place)
        finally:
            plane.close()
    layout = decode_layout(data)
    assert len(placed) == 2
    assert out[layout.data_offset :] == data[layout.data_offset :]


@pytest.mark.parametrize("read", list(READS.values()), ids=list(READS))
def test_a_data_plane_that_never_answers_a_read_costs_the_clients_timeout(
    read: Callable[[TcpDataPlane, bytes, list[bytes], PlaceStream], None],
) -> None:
    """A partition after the hello (the peer takes the request, then nothing): the read
    fails with a timeout, not a stuck turn, and its connection is not reused."""
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def hello_then_silence() -> None:
            conn, _ = listener.accept()
            recv_frame(conn, 1 << 20)
            conn.sendall(pack_frame({"ok": True}))
            conn.recv(1 << 16)  # the read's request, never answered
            done.wait()
            conn.close()

        done = threading.Event()
        server = threading.Thread(target=hello_then_silence, daemon=True)
        server.start()
        plane = TcpDataPlane("127.0.0.1", listener.getsockname()[1], ssl_context=None, server_hostname=None,
                             token=None, timeout_seconds=0.5)  # fmt: skip
        try:
            with pytest.raises(TimeoutError):
                read(plane, NAMESPACE, [b"\x01" * 32], lambda headers: [])
            assert plane._take_idle() is None  # the timed-out connection was closed
        finally:
            done.set()
            plane.close()
            server.join()
