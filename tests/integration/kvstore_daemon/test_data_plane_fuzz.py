"""Fuzzed data-plane connections against a real daemon: garbage before or after the hello,
requests of every shape, and valid requests cut at any byte. None may crash the daemon,
leave a lease or a held chunk behind, or stop it serving a well-behaved reader."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_probes import free_port

from attnstore.data_plane_wire import pack_frame
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client import KVStoreClient

if TYPE_CHECKING:
    from conftest import ChunkSet, DaemonFactory, DaemonProcess

NAMESPACE = b"data-plane-fuzz!"
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
HELLO = pack_frame({"op": "hello", "token": None})
_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.binary(max_size=40),
    st.text(max_size=10),
    st.lists(st.integers(-5, 2**40), max_size=5),
    st.lists(st.lists(st.integers(-5, 2**40), max_size=3), max_size=3),
    st.lists(st.binary(min_size=31, max_size=33), max_size=3),
)
_requests = st.fixed_dictionaries(
    {"op": st.sampled_from(["get", "put", "hello", "x"])},
    optional={
        name: _values
        for name in ("namespace", "keys", "lease", "chunks", "layer_start", "layer_end", "release", "writes")
    },
)


@pytest.fixture(scope="module")
def daemon(module_daemon_factory: DaemonFactory) -> DaemonProcess:
    return module_daemon_factory(DATA_PLANE_PORT=free_port(), DATA_PLANE_IDLE_TIMEOUT_SECONDS=2.0)


@pytest.fixture(scope="module")
def stub(daemon: DaemonProcess) -> Iterator[kvstore_pb2_grpc.KVStoreStub]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield kvstore_pb2_grpc.KVStoreStub(channel)


@pytest.fixture(scope="module")
def chunks(chunk_set: type[ChunkSet], daemon: DaemonProcess) -> ChunkSet:
    made = chunk_set(NAMESPACE, num_layers=4, seed=3)
    with KVStoreClient(daemon.address, use_shm=False) as client:
        made.register(client)
        client.put_chunks(NAMESPACE, made.items(0, 2))
    return made


def _exchange(port: int, payload: bytes) -> None:
    """Sends `payload`, reads what comes back for a moment, and hangs up."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(payload)
        sock.settimeout(0.2)
        try:
            while sock.recv(1 << 16):
                pass
        except (TimeoutError, ConnectionResetError):
            pass


def _check_still_serving(daemon: DaemonProcess, stub: kvstore_pb2_grpc.KVStoreStub, chunks: ChunkSet) -> None:
    with KVStoreClient(daemon.address, use_shm=False) as client:
        assert client.get_whole_chunks(NAMESPACE, chunks.keys(0, 2)) == [chunks.data(0), chunks.data(1)]
    assert stub.Stats(kvstore_pb2.StatsRequest()).leases == 0


def _port(stub: kvstore_pb2_grpc.KVStoreStub) -> int:
    return stub.OpenDataPlane(kvstore_pb2.OpenDataPlaneRequest()).port


@FUZZ
@given(garbage=st.binary(min_size=1, max_size=300), after_hello=st.booleans())
def test_garbage_costs_nothing(daemon, stub, chunks, garbage: bytes, after_hello: bool) -> None:
    _exchange(_port(stub), (HELLO if after_hello else b"") + garbage)
    assert stub.Stats(kvstore_pb2.StatsRequest()).leases == 0


@FUZZ
@given(request=_requests)
def test_requests_of_any_shape_cost_nothing(daemon, stub, chunks, request: dict[str, object]) -> None:
    _exchange(_port(stub), HELLO + pack_frame(request))
    assert stub.Stats(kvstore_pb2.StatsRequest()).leases == 0


@FUZZ
@given(cut=st.floats(0, 1, exclude_max=True), layer_end=st.integers(0, 4))
def test_a_request_cut_mid_frame_leaves_no_lease(daemon, stub, chunks, cut: float, layer_end: int) -> None:
    lease = stub.GetShm(kvstore_pb2.GetShmRequest(namespace=NAMESPACE, keys=chunks.keys(0, 2))).lease_id
    frame = pack_frame({"op": "get", "namespace": NAMESPACE, "lease": lease, "chunks": [0, 1],
                        "layer_start": 0, "layer_end": layer_end, "release": True})  # fmt: skip
    _exchange(_port(stub), HELLO + frame[: int(len(frame) * cut)])
    stub.ReleaseLease(
        kvstore_pb2.ReleaseLeaseRequest(lease_ids=[lease])
    )  # a client's cleanup after a failure
    assert stub.Stats(kvstore_pb2.StatsRequest()).leases == 0


def test_a_stalled_connection_is_closed_after_the_idle_timeout(daemon, stub, chunks) -> None:
    with socket.create_connection(("127.0.0.1", _port(stub)), timeout=10) as sock:
        sock.sendall(HELLO + struct.pack("!I", 100) + b"\x80")  # a frame that never completes
        sock.settimeout(10)
        assert sock.recv(1 << 16) == pack_frame({"ok": True})  # the hello's answer
        assert sock.recv(1 << 16) == b""  # then closed by the daemon within its 2 s idle timeout
    _check_still_serving(daemon, stub, chunks)


def test_after_the_fuzzing_the_daemon_serves_as_before(daemon, stub, chunks) -> None:
    _check_still_serving(daemon, stub, chunks)
