"""Every KVStore RPC refuses bad input with the right status and a message naming the
problem, and a refused call changes nothing stored. The raw generated stub is used so
the test sees the daemon's real statuses; one daemon serves the whole module."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from attnstore.kvstore.v1 import kvstore_pb2 as pb
from attnstore.kvstore.v1 import kvstore_pb2_grpc
from attnstore.kvstore_client import KVStoreClient
from kvstore_daemon.servicer import MAX_HINT_SOURCE_CHARS

if TYPE_CHECKING:  # the fixtures' types; conftest modules are not imported by name
    from conftest import ChunkSet, DaemonFactory, DaemonProcess

MAX_KEYS = 8
SERVICE = "attnstore.kvstore.v1.KVStore"
INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
OUT_OF_RANGE, ALREADY_EXISTS = grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ALREADY_EXISTS
UNKNOWN_NAMESPACE = b"\xee" * 16
NEW_NAMESPACE = b"\x01" * 16  # never successfully registered
OTHER_NAMESPACE = b"\x0f" * 16  # registered with the same layout, holding nothing
RESERVED = 10  # the chunk index each test holds an open, never committed reservation for
ABSENT = 20  # chunk indices from here on are never stored
UNKNOWN_ID = 987_654_321


@dataclass
class Store:
    """The module's daemon: chunks 0-2 committed and, per test, one open reservation."""

    daemon: DaemonProcess
    stub: kvstore_pb2_grpc.KVStoreStub
    chunks: ChunkSet
    max_chunk_bytes: int
    write_id: int = 0  # the open reservation of the current test

    @property
    def ns(self) -> bytes:
        return self.chunks.namespace

    def key(self, index: int) -> bytes:
        return self.chunks.key(index)

    def snapshot(self) -> tuple[Any, ...]:
        """What a refused call must not change: occupancy counters and a lookup."""
        s = self.stub.Stats(pb.StatsRequest())
        lookup = self.stub.Lookup(
            pb.LookupRequest(namespace=self.ns, keys=[*self.chunks.keys(0, 3), self.key(RESERVED)])
        )
        return (
            (
                s.dram.used_bytes,
                s.dram.chunks,
                s.dram.evictions,
                s.ssd.used_bytes,
                s.ssd.chunks,
                s.ssd.evictions,
            ),
            (s.namespaces, s.reservations, s.leases, s.pinned_chunks, s.promotions, s.demotions),
            (lookup.prefix_length, list(lookup.tiers)),
        )


@pytest.fixture(scope="module")
def module_store(module_daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]) -> Iterator[Store]:
    daemon = module_daemon_factory(MAX_KEYS_PER_REQUEST=MAX_KEYS)
    chunks = chunk_set()
    with KVStoreClient(daemon.address) as client:
        max_chunk_bytes = chunks.register(client)
        client.register_namespace(OTHER_NAMESPACE, **chunks.layout)
        assert client.put_chunks(chunks.namespace, chunks.items(0, 3), durable=True).stored == chunks.keys(
            0, 3
        )
    with grpc.insecure_channel(daemon.address) as channel:
        yield Store(daemon, kvstore_pb2_grpc.KVStoreStub(channel), chunks, max_chunk_bytes)


@pytest.fixture
def store(module_store: Store) -> Iterator[Store]:
    """The module's store with a fresh open reservation, which must still be abortable after
    the test: a refused call never consumes a reservation."""
    item = pb.PutItem(key=module_store.key(RESERVED), size_bytes=len(module_store.chunks.data(RESERVED)))
    [reservation] = module_store.stub.ReservePut(
        pb.ReservePutRequest(namespace=module_store.ns, items=[item])
    ).reservations
    assert reservation.status == pb.RESERVE_STATUS_RESERVED
    module_store.write_id = reservation.write_id
    yield module_store
    assert module_store.stub.AbortPut(pb.AbortPutRequest(write_ids=[reservation.write_id])).aborted_count == 1


# ---- the refused calls -----------------------------------------------------------------------

Call = Callable[[Store], object]


@dataclass(frozen=True)
class Case:
    call: Call
    code: grpc.StatusCode
    message: str  # a fragment the status details must contain


# Every RPC that names a namespace and chunk keys, called with the given ones.
KEYED_RPCS: dict[str, Callable[[kvstore_pb2_grpc.KVStoreStub, bytes, list[bytes]], object]] = {
    "Lookup": lambda stub, ns, keys: stub.Lookup(pb.LookupRequest(namespace=ns, keys=keys)),
    "ReservePut": lambda stub, ns, keys: stub.ReservePut(
        pb.ReservePutRequest(namespace=ns, items=[pb.PutItem(key=key, size_bytes=4096) for key in keys])
    ),
    "Get": lambda stub, ns, keys: list(stub.Get(pb.GetRequest(namespace=ns, keys=keys))),
    "GetShm": lambda stub, ns, keys: stub.GetShm(pb.GetShmRequest(namespace=ns, keys=keys)),
    "Delete": lambda stub, ns, keys: stub.Delete(pb.DeleteRequest(namespace=ns, keys=keys)),
    "Pin": lambda stub, ns, keys: stub.Pin(pb.PinRequest(namespace=ns, keys=keys)),
    "Unpin": lambda stub, ns, keys: stub.Unpin(pb.UnpinRequest(namespace=ns, keys=keys)),
    "Hint": lambda stub, ns, keys: stub.Hint(
        pb.HintRequest(namespace=ns, entries=[pb.HintEntry(keys=keys, action=pb.HINT_ACTION_PROTECT)])
    ),
}
# What is wrong with the (namespace, keys) of a keyed call, and how the daemon must answer.
KEYED_BAD_INPUT: dict[str, tuple[Callable[[Store], tuple[bytes, list[bytes]]], grpc.StatusCode, str]] = {
    "short-namespace": (lambda s: (s.ns[:15], [s.key(0)]), INVALID, "namespace must be 16 bytes, got 15"),
    "long-namespace": (lambda s: (s.ns + b"x", [s.key(0)]), INVALID, "namespace must be 16 bytes, got 17"),
    "unknown-namespace": (lambda s: (UNKNOWN_NAMESPACE, [s.key(ABSENT)]), NOT_FOUND, "unknown namespace"),
    "short-key": (
        lambda s: (s.ns, [s.key(ABSENT), s.key(0)[:31]]),
        INVALID,
        "[1] must be a 32-byte chunk key",
    ),
    "long-key": (lambda s: (s.ns, [s.key(0) + b"\0"]), INVALID, "[0] must be a 32-byte chunk key, got 33"),
    "too-many-keys": (
        lambda s: (s.ns, s.chunks.keys(ABSENT, ABSENT + MAX_KEYS + 1)),
        INVALID,
        f"holds {MAX_KEYS + 1} keys; at most {MAX_KEYS} are allowed",
    ),
}


# A key named twice would be read, leased or counted twice (issue 26, point 10). Hint alone
# may name a key in several entries (a shared prefix needed by several queued jobs).
REPEATED_KEY_RPCS = [rpc for rpc in KEYED_RPCS if rpc != "Hint"]


def repeated_key(s: Store) -> tuple[bytes, list[bytes]]:
    return s.ns, [s.key(0), s.key(1), s.key(0)]


def keyed(rpc: str, target: Callable[[Store], tuple[bytes, list[bytes]]]) -> Call:
    return lambda s: KEYED_RPCS[rpc](s.stub, *target(s))


def register(layout: pb.NamespaceLayout | None, namespace: bytes = NEW_NAMESPACE) -> Call:
    return lambda s: s.stub.RegisterNamespace(pb.RegisterNamespaceRequest(namespace=namespace, layout=layout))


def layout(**changes: Any) -> pb.NamespaceLayout:
    """The module's chunk layout (ChunkSet's defaults), with `changes`."""
    fields: dict[str, Any] = {
        "num_layers": 4,
        "kv_heads": 2,
        "head_dim": 32,
        "chunk_tokens": 16,
        "dtype": "float16",
    }
    return pb.NamespaceLayout(**{**fields, **changes})


def reserve(
    size: Callable[[Store], int], *, indices: tuple[int, ...] = (ABSENT,), ttl_seconds: int = 0
) -> Call:
    def call(s: Store) -> object:
        items = [pb.PutItem(key=s.key(index), size_bytes=size(s)) for index in indices]
        return s.stub.ReservePut(pb.ReservePutRequest(namespace=s.ns, items=items, ttl_seconds=ttl_seconds))

    return call


def write(offset: Callable[[Store], int], data: bytes, write_id: int | None = None) -> Call:
    def call(s: Store) -> object:
        piece = pb.WritePutRequest(write_id=write_id or s.write_id, offset_bytes=offset(s), data=data)
        return s.stub.WritePut(iter([piece]))

    return call


def write_then_commit(data: Callable[[Store], bytes]) -> Call:
    """Writes `data` into the open reservation, then commits it."""

    def call(s: Store) -> object:
        s.stub.WritePut(iter([pb.WritePutRequest(write_id=s.write_id, offset_bytes=0, data=data(s))]))
        return s.stub.CommitPut(pb.CommitPutRequest(write_ids=[s.write_id]))

    return call


def commit(ids: Callable[[Store], list[int]]) -> Call:
    return lambda s: s.stub.CommitPut(pb.CommitPutRequest(write_ids=ids(s)))


def abort(ids: Callable[[Store], list[int]]) -> Call:
    return lambda s: s.stub.AbortPut(pb.AbortPutRequest(write_ids=ids(s)))


def release(ids: Callable[[Store], list[int]]) -> Call:
    return lambda s: s.stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_ids=ids(s)))


def report_reads(*entries: tuple[bytes | None, list[bytes | int]]) -> Call:
    """ReleaseLease carrying only lease-free reads: (namespace or None for the store's,
    keys as raw bytes or chunk indices) per entry."""

    def call(s: Store) -> object:
        reads = [
            pb.LeaseFreeReads(
                namespace=s.ns if ns is None else ns,
                keys=[k if isinstance(k, bytes) else s.key(k) for k in keys],
            )
            for ns, keys in entries
        ]
        return s.stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_free_reads=reads))

    return call


def get(*, indices: tuple[int, ...] = (0,), layer_start: int = 0, layer_end: int = 0) -> Call:
    def call(s: Store) -> object:
        keys = [s.key(index) for index in indices]
        request = pb.GetRequest(namespace=s.ns, keys=keys, layer_start=layer_start, layer_end=layer_end)
        return list(s.stub.Get(request))

    return call


def get_shm(*, indices: tuple[int, ...] = (0,), lease_ttl_seconds: int = 0) -> Call:
    def call(s: Store) -> object:
        keys = [s.key(index) for index in indices]
        return s.stub.GetShm(pb.GetShmRequest(namespace=s.ns, keys=keys, lease_ttl_seconds=lease_ttl_seconds))

    return call


def hint(action: int, ttl_seconds: int = 0, next_use_seconds: float = 0.0, source: str = "") -> Call:
    def call(s: Store) -> object:
        entries = [
            pb.HintEntry(keys=[s.key(1)], action=pb.HINT_ACTION_PROTECT),
            pb.HintEntry(keys=[s.key(0)], action=action, next_use_seconds=next_use_seconds),
        ]
        request = pb.HintRequest(namespace=s.ns, entries=entries, ttl_seconds=ttl_seconds, source=source)
        return s.stub.Hint(request)

    return call


CASES: dict[str, Case] = {
    **{
        f"{rpc}-{bad}": Case(keyed(rpc, target), code, message)
        for bad, (target, code, message) in KEYED_BAD_INPUT.items()
        for rpc in KEYED_RPCS
    },
    **{
        f"{rpc}-repeated-key": Case(
            keyed(rpc, repeated_key), INVALID, "keys must not repeat a key: keys[2] repeats keys[0] ("
        )
        for rpc in REPEATED_KEY_RPCS
    },
    "ReleaseLease-reads-repeated-key": Case(
        report_reads((None, [0]), (None, [1, 2, 1])),
        INVALID,
        "lease_free_reads[1].keys must not repeat a key: lease_free_reads[1].keys[2] repeats",
    ),
    "RegisterNamespace-short-namespace": Case(
        register(layout(), namespace=bytes(8)), INVALID, "namespace must be 16 bytes, got 8"
    ),
    "RegisterNamespace-missing-layout": Case(register(None), INVALID, "layout is required"),
    "RegisterNamespace-bad-dtype": Case(
        register(layout(dtype="int8")), INVALID, "layout.dtype must be one of"
    ),
    "RegisterNamespace-zero-layers": Case(
        register(layout(num_layers=0)), INVALID, "layout.num_layers must be"
    ),
    "RegisterNamespace-label-too-long": Case(register(layout(model_label="m" * 300)), INVALID, "model_label"),
    "RegisterNamespace-chunks-too-large": Case(
        register(layout(num_layers=4096, kv_heads=64, head_dim=256, chunk_tokens=256)),
        INVALID,
        "max_chunk_bytes",
    ),
    "RegisterNamespace-conflicting-layout": Case(
        register(layout(head_dim=64), namespace=bytes(range(16))), ALREADY_EXISTS, "different layout"
    ),
    "ReservePut-no-items": Case(reserve(lambda s: 1, indices=()), INVALID, "items must not be empty"),
    "ReservePut-empty-chunk": Case(reserve(lambda s: 0), INVALID, "of 0 bytes is outside 1.."),
    "ReservePut-oversized-chunk": Case(
        reserve(lambda s: s.max_chunk_bytes + 1), INVALID, "bytes is outside 1.."
    ),
    "ReservePut-duplicate-keys": Case(
        reserve(lambda s: 4096, indices=(ABSENT, ABSENT + 1, ABSENT)), INVALID, "must not repeat a key"
    ),
    "ReservePut-ttl-above-maximum": Case(
        reserve(lambda s: 4096, ttl_seconds=301), INVALID, "ttl_seconds of 301s exceeds the maximum of 300s"
    ),
    "WritePut-unknown-write-id": Case(
        write(lambda s: 0, b"x", UNKNOWN_ID), NOT_FOUND, f"write id {UNKNOWN_ID}"
    ),
    "WritePut-past-the-reservation": Case(
        write(lambda s: len(s.chunks.data(RESERVED)) - 8, bytes(16)), OUT_OF_RANGE, "runs past the"
    ),
    "WritePut-far-past-the-reservation": Case(write(lambda s: 1 << 40, b"x"), OUT_OF_RANGE, "runs past the"),
    "CommitPut-no-ids": Case(commit(lambda s: []), INVALID, "write_ids must not be empty"),
    "CommitPut-unknown-write-id": Case(commit(lambda s: [UNKNOWN_ID]), NOT_FOUND, f"write id {UNKNOWN_ID}"),
    "CommitPut-open-and-unknown-ids": Case(
        commit(lambda s: [s.write_id, UNKNOWN_ID]), NOT_FOUND, "is unknown"
    ),
    "CommitPut-duplicate-ids": Case(
        commit(lambda s: [s.write_id, s.write_id]), INVALID, "must not repeat an id"
    ),
    "CommitPut-too-many-ids": Case(
        commit(lambda s: list(range(1, MAX_KEYS + 2))), INVALID, f"at most {MAX_KEYS}"
    ),
    "CommitPut-garbage-bytes": Case(
        write_then_commit(lambda s: bytes(range(256)) * 16), INVALID, "not a valid chunk"
    ),
    "CommitPut-half-written": Case(
        write_then_commit(lambda s: s.chunks.data(RESERVED, version=1)[:5000]), INVALID, "not a valid chunk"
    ),
    "CommitPut-wrong-key-in-header": Case(
        write_then_commit(lambda s: s.chunks.data(0)), INVALID, "header's key or namespace differs"
    ),
    "AbortPut-no-ids": Case(abort(lambda s: []), INVALID, "write_ids must not be empty"),
    "AbortPut-duplicate-ids": Case(
        abort(lambda s: [s.write_id, s.write_id]), INVALID, "must not repeat an id"
    ),
    "AbortPut-too-many-ids": Case(
        abort(lambda s: list(range(1, MAX_KEYS + 2))), INVALID, f"at most {MAX_KEYS}"
    ),
    "Get-no-keys": Case(get(indices=()), INVALID, "keys must not be empty"),
    "Get-layer-start-past-the-end": Case(get(layer_start=4), OUT_OF_RANGE, "layer range [4, 4) is outside"),
    "Get-layer-end-past-the-end": Case(get(layer_end=5), OUT_OF_RANGE, "outside the namespace's 4 layers"),
    "Get-empty-layer-range": Case(get(layer_start=2, layer_end=2), OUT_OF_RANGE, "layer range [2, 2)"),
    "Get-reversed-layer-range": Case(get(layer_start=3, layer_end=1), OUT_OF_RANGE, "layer range [3, 1)"),
    "Get-uncommitted-chunk": Case(get(indices=(RESERVED,)), NOT_FOUND, "is not stored"),
    "Get-stored-and-absent": Case(get(indices=(0, ABSENT)), NOT_FOUND, "is not stored"),
    "Get-key-of-another-namespace": Case(
        lambda s: list(s.stub.Get(pb.GetRequest(namespace=OTHER_NAMESPACE, keys=[s.key(0)]))),
        NOT_FOUND,
        "not stored",
    ),
    "GetShm-no-keys": Case(get_shm(indices=()), INVALID, "keys must not be empty"),
    "GetShm-uncommitted-chunk": Case(get_shm(indices=(1, RESERVED)), NOT_FOUND, "is not stored"),
    "GetShm-lease-above-maximum": Case(
        get_shm(lease_ttl_seconds=301), INVALID, "lease_ttl_seconds of 301s exceeds the maximum of 300s"
    ),
    "GetShm-duplicate-release-ids": Case(
        lambda s: s.stub.GetShm(
            pb.GetShmRequest(namespace=s.ns, keys=[s.key(0)], release_lease_ids=[UNKNOWN_ID, UNKNOWN_ID])
        ),
        INVALID,
        "release_lease_ids must not repeat an id",
    ),
    "GetShm-too-many-release-ids": Case(
        lambda s: s.stub.GetShm(
            pb.GetShmRequest(namespace=s.ns, keys=[s.key(0)], release_lease_ids=range(1, MAX_KEYS + 2))
        ),
        INVALID,
        f"release_lease_ids holds {MAX_KEYS + 1} ids; at most {MAX_KEYS}",
    ),
    "ReleaseLease-no-ids": Case(release(lambda s: []), INVALID, "lease_ids must not be empty"),
    "ReleaseLease-duplicate-ids": Case(release(lambda s: [7, 7]), INVALID, "lease_ids must not repeat an id"),
    "ReleaseLease-too-many-ids": Case(
        release(lambda s: list(range(1, MAX_KEYS + 2))), INVALID, f"at most {MAX_KEYS} are allowed"
    ),
    "ReleaseLease-reads-short-namespace": Case(
        report_reads((b"short", [0])), INVALID, "namespace must be 16 bytes, got 5"
    ),
    "ReleaseLease-reads-unknown-namespace": Case(
        report_reads((UNKNOWN_NAMESPACE, [0])), NOT_FOUND, "namespace"
    ),
    "ReleaseLease-reads-short-key": Case(
        report_reads((None, [0]), (None, [1, b"short"])),
        INVALID,
        "lease_free_reads[1].keys[1] must be a 32-byte chunk key, got 5 bytes",
    ),
    "ReleaseLease-reads-too-many-keys": Case(
        report_reads((None, list(range(MAX_KEYS))), (OTHER_NAMESPACE, [0])),
        INVALID,
        f"lease_free_reads name more than {MAX_KEYS} keys in all",
    ),
    "Pin-ttl-above-maximum": Case(
        lambda s: s.stub.Pin(pb.PinRequest(namespace=s.ns, keys=[s.key(0)], ttl_seconds=3601)),
        INVALID,
        "ttl_seconds of 3601s exceeds the maximum of 3600s",
    ),
    "Hint-unspecified-action": Case(hint(pb.HINT_ACTION_UNSPECIFIED), INVALID, "entries[1].action must be"),
    "Hint-unknown-action": Case(
        hint(99), INVALID, "entries[1].action must be PREFETCH, PROTECT, PREDICT, EVICT_FIRST or DECLINE"
    ),
    "Hint-ttl-above-maximum": Case(
        hint(pb.HINT_ACTION_PREFETCH, ttl_seconds=601),
        INVALID,
        "ttl_seconds of 601s exceeds the maximum of 600s",
    ),
    "Hint-negative-next-use": Case(
        hint(pb.HINT_ACTION_PREDICT, next_use_seconds=-1.0),
        INVALID,
        "entries[1].next_use_seconds must be finite and not negative, got -1.0",
    ),
    "Hint-infinite-next-use": Case(
        hint(pb.HINT_ACTION_PREDICT, next_use_seconds=math.inf),
        INVALID,
        "entries[1].next_use_seconds must be finite and not negative",
    ),
    "Hint-source-too-long": Case(
        hint(pb.HINT_ACTION_PREDICT, source="r" * (MAX_HINT_SOURCE_CHARS + 1)),
        INVALID,
        f"source must be at most {MAX_HINT_SOURCE_CHARS} characters",
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_input_is_refused_and_changes_nothing(store: Store, case: Case) -> None:
    before = store.snapshot()
    with pytest.raises(grpc.RpcError) as refused:
        case.call(store)
    details = refused.value.details() or ""
    assert refused.value.code() == case.code, details
    assert case.message in details
    assert store.snapshot() == before


# ---- calls that are not errors -----------------------------------------------------------------


def test_absent_targets_are_answered_not_refused(store: Store) -> None:
    """Ending what does not exist is a no-op with a count of 0, never an error."""
    before = store.snapshot()
    stub, absent = store.stub, [store.key(ABSENT)]
    assert stub.AbortPut(pb.AbortPutRequest(write_ids=[UNKNOWN_ID])).aborted_count == 0
    assert stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_ids=[UNKNOWN_ID])).released_count == 0
    assert report_reads((None, [ABSENT]), (OTHER_NAMESPACE, [0]))(store).released_count == 0  # type: ignore[attr-defined]
    assert stub.Delete(pb.DeleteRequest(namespace=store.ns, keys=absent)).deleted_count == 0
    assert stub.Pin(pb.PinRequest(namespace=store.ns, keys=absent)).pinned_count == 0
    assert stub.Unpin(pb.UnpinRequest(namespace=store.ns, keys=[store.key(0)])).unpinned_count == 0
    assert stub.Lookup(pb.LookupRequest(namespace=store.ns, keys=[store.key(RESERVED)])).prefix_length == 0
    assert stub.Lookup(pb.LookupRequest(namespace=OTHER_NAMESPACE, keys=[store.key(0)])).prefix_length == 0
    assert stub.OpenShm(pb.OpenShmRequest()).size_bytes > 0  # OpenShm and Stats take no input
    assert store.snapshot() == before


def test_a_refused_commit_commits_none_of_its_chunks(store: Store) -> None:
    """CommitPut checks every chunk before making any visible."""
    stub, good = store.stub, store.chunks.data(ABSENT)
    item = pb.PutItem(key=store.key(ABSENT), size_bytes=len(good))
    [other] = stub.ReservePut(pb.ReservePutRequest(namespace=store.ns, items=[item])).reservations
    stub.WritePut(iter([pb.WritePutRequest(write_id=other.write_id, offset_bytes=0, data=good)]))
    stub.WritePut(iter([pb.WritePutRequest(write_id=store.write_id, offset_bytes=0, data=bytes(4096))]))
    with pytest.raises(grpc.RpcError) as refused:
        stub.CommitPut(pb.CommitPutRequest(write_ids=[other.write_id, store.write_id]))
    assert refused.value.code() == INVALID
    assert stub.Lookup(pb.LookupRequest(namespace=store.ns, keys=[store.key(ABSENT)])).prefix_length == 0
    assert stub.AbortPut(pb.AbortPutRequest(write_ids=[other.write_id])).aborted_count == 1


def test_health_reports_serving(module_store: Store) -> None:
    with grpc.insecure_channel(module_store.daemon.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
        assert unknown.value.code() == NOT_FOUND


def test_reflection_lists_the_kvstore_service(module_store: Store) -> None:
    with grpc.insecure_channel(module_store.daemon.address) as channel:
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        [reply] = list(reflection.ServerReflectionInfo(iter([request])))
        names = {service.name for service in reply.list_services_response.service}
        assert {SERVICE, "grpc.health.v1.Health"} <= names
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)
        [reply] = list(reflection.ServerReflectionInfo(iter([request])))
        assert reply.file_descriptor_response.file_descriptor_proto
