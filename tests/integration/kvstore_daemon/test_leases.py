"""What protects a chunk from eviction in a real daemon (read leases, pins) and how every
such hold ends on its own (lease and reservation TTLs), even when its client dies."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from small_arena import FOUR_CHUNK_DRAM, SHAPE, MiB

from attnstore.kvstore.v1 import kvstore_pb2 as pb
from attnstore.kvstore_client import KVStoreClient, Tier
from attnstore.shm_arena import Extent, SharedArena

if TYPE_CHECKING:  # the fixtures' types; conftest modules are not imported by name
    from collections.abc import Callable

    from conftest import ChunkSet, DaemonFactory, DaemonProcess, PollUntil

    from attnstore.kvstore.v1.kvstore_pb2_grpc import KVStoreStub

# A client that takes a lease, reports it, then blocks until it is killed.
LEASE_HOLDER = """
import sys
import grpc
from attnstore.kvstore.v1 import kvstore_pb2 as pb, kvstore_pb2_grpc
address, namespace, key = sys.argv[1], bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
stub = kvstore_pb2_grpc.KVStoreStub(grpc.insecure_channel(address))
reply = stub.GetShm(pb.GetShmRequest(namespace=namespace, keys=[key]))
print(reply.lease_id, flush=True)
sys.stdin.read()
"""


def map_arena(stub: KVStoreStub) -> SharedArena:
    reply = stub.OpenShm(pb.OpenShmRequest())
    return SharedArena(Path(reply.path), reply.size_bytes)


def extents_of(location: pb.ChunkLocation) -> list[Extent]:
    return [(extent.offset_bytes, extent.length_bytes) for extent in location.extents]


def release(stub: KVStoreStub, lease_id: int) -> bool:
    """Whether ReleaseLease ended the lease (False: it had expired or ended already)."""
    return stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_ids=[lease_id])).released_count == 1


def put_one_by_one(client: KVStoreClient, chunks: ChunkSet, indices: range) -> None:
    for index in indices:
        assert client.put_chunks(chunks.namespace, chunks.items(index, index + 1)).stored == [
            chunks.key(index)
        ]


@contextmanager
def four_chunk_daemon(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], stored: int, **settings: object
) -> Iterator[tuple[DaemonProcess, ChunkSet, KVStoreClient]]:
    """A daemon whose DRAM holds four chunks, a client on it, and chunks 0..stored-1 put
    one by one."""
    daemon = daemon_factory(**FOUR_CHUNK_DRAM, **settings)
    chunks = chunk_set(**SHAPE)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        put_one_by_one(client, chunks, range(stored))
        yield daemon, chunks, client


@pytest.mark.parametrize("ending", ["release", "expiry"])
def test_a_leased_chunk_survives_eviction_until_its_lease_ends(
    daemon_factory: DaemonFactory,
    chunk_set: type[ChunkSet],
    raw_stub: Callable[[DaemonProcess], KVStoreStub],
    poll_until: PollUntil,
    ending: str,
) -> None:
    with four_chunk_daemon(daemon_factory, chunk_set, 1) as (daemon, chunks, client):
        ns, key, data = chunks.namespace, chunks.key(0), chunks.data(0)
        stub = raw_stub(daemon)
        ttl_seconds = 2 if ending == "expiry" else 60
        lease = stub.GetShm(pb.GetShmRequest(namespace=ns, keys=[key], lease_ttl_seconds=ttl_seconds))
        assert lease.lease_ttl_ms == ttl_seconds * 1000
        extents = extents_of(lease.chunks[0])
        arena = map_arena(stub)
        try:
            assert arena.read(extents, 0, len(data)) == data
            put_one_by_one(client, chunks, range(1, 9))  # twice the arena: every other chunk moves
            assert arena.read(extents, 0, len(data)) == data, "a leased chunk's bytes changed"
        finally:
            arena.close()
        stats = client.stats()
        assert stats.leases == 1 and stats.dram.evictions >= 5
        assert chunks.tiers(client, [0]) == [Tier.DRAM]

        if ending == "release":
            assert release(stub, lease.lease_id)
        else:
            poll_until(lambda: client.stats().leases == 0, what="the lease to expire")
            assert not release(stub, lease.lease_id)
        assert client.stats().leases == 0
        put_one_by_one(client, chunks, range(9, 14))  # chunk 0 is now the least recently used
        assert chunks.tiers(client, [0]) == [Tier.SSD]
        assert client.get_whole_chunks(ns, [key]) == [data]


def test_a_dram_full_of_leased_chunks_refuses_puts_until_released(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], raw_stub: Callable[[DaemonProcess], KVStoreStub]
) -> None:
    with four_chunk_daemon(daemon_factory, chunk_set, 4) as (daemon, chunks, client):
        stub = raw_stub(daemon)
        lease = stub.GetShm(pb.GetShmRequest(namespace=chunks.namespace, keys=chunks.keys(0, 4)))
        refused = client.put_chunks(chunks.namespace, chunks.items(4, 5))
        assert refused.no_space == [chunks.key(4)] and not refused.stored
        stats = client.stats()
        assert stats.reservations == 0 and stats.dram.chunks == 4 and stats.dram.evictions == 0

        assert release(stub, lease.lease_id)
        assert client.put_chunks(chunks.namespace, chunks.items(4, 5)).stored == [chunks.key(4)]
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 3)) == [
            chunks.data(i) for i in range(3)
        ]


def test_a_dead_clients_lease_expires(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    with four_chunk_daemon(daemon_factory, chunk_set, 1, LEASE_TTL_SECONDS=2) as (daemon, chunks, client):
        holder = subprocess.Popen(
            [sys.executable, "-c", LEASE_HOLDER, daemon.address, chunks.namespace.hex(), chunks.key(0).hex()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip().isdigit(), "the lease holder failed to take its lease"
            assert client.stats().leases == 1
        finally:
            holder.kill()  # SIGKILL: no ReleaseLease, no goodbye
            holder.wait()
        poll_until(lambda: client.stats().leases == 0, what="the dead client's lease to expire")
        put_one_by_one(client, chunks, range(1, 5))
        assert chunks.tiers(client, [0]) == [Tier.SSD]  # no longer held: evicted like any other


def test_an_uncommitted_reservation_expires_and_frees_its_blocks(
    daemon_factory: DaemonFactory,
    chunk_set: type[ChunkSet],
    raw_stub: Callable[[DaemonProcess], KVStoreStub],
    poll_until: PollUntil,
) -> None:
    with four_chunk_daemon(daemon_factory, chunk_set, 1) as (daemon, chunks, client):
        ns, key, data = chunks.namespace, chunks.key(1), chunks.data(1)
        stub = raw_stub(daemon)
        baseline = client.stats().dram.used_bytes
        item = pb.PutItem(key=key, size_bytes=len(data))
        [reservation] = stub.ReservePut(
            pb.ReservePutRequest(namespace=ns, items=[item], ttl_seconds=1)
        ).reservations
        assert reservation.status == pb.RESERVE_STATUS_RESERVED
        stub.WritePut(iter([pb.WritePutRequest(write_id=reservation.write_id, offset_bytes=0, data=data)]))
        stats = client.stats()
        assert stats.reservations == 1 and stats.dram.used_bytes == baseline + MiB

        poll_until(
            lambda: (s := client.stats()).reservations == 0 and s.dram.used_bytes == baseline,
            what="the reservation to expire and return its blocks",
        )
        with pytest.raises(grpc.RpcError) as failed:
            stub.CommitPut(pb.CommitPutRequest(write_ids=[reservation.write_id]))
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        assert "write id" in (failed.value.details() or "")
        assert client.lookup(ns, [key]).prefix_length == 0
        assert client.put_chunks(ns, {key: data}).stored == [key]  # the key is free again


def test_a_key_deleted_under_another_readers_lease_is_put_again_at_once(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], raw_stub: Callable[[DaemonProcess], KVStoreStub]
) -> None:
    """A worker replacing a chunk (delete, then put other bytes under the key) while another
    client still leases the old one, its SSD write perhaps still running: the put is stored
    at once, the lease keeps the old bytes, everyone else reads the new ones, down to SSD
    and back."""
    with four_chunk_daemon(daemon_factory, chunk_set, 1) as (daemon, chunks, client):
        ns, key, old, new = chunks.namespace, chunks.key(0), chunks.data(0), chunks.data(0, version=1)
        stub = raw_stub(daemon)
        lease = stub.GetShm(pb.GetShmRequest(namespace=ns, keys=[key]))
        assert client.delete(ns, [key]) == 1
        assert client.put_chunks(ns, {key: new}).stored == [key]
        assert client.get_whole_chunks(ns, [key]) == [new]
        arena = map_arena(stub)
        try:
            assert arena.read(extents_of(lease.chunks[0]), 0, len(old)) == old  # the lease's bytes stay
        finally:
            arena.close()
        assert client.stats().dram.used_bytes == 2 * MiB  # the old copy lasts as long as its lease

        assert release(stub, lease.lease_id)
        stats = client.stats()
        assert stats.dram.used_bytes == MiB and stats.dram.chunks == 1
        put_one_by_one(client, chunks, range(1, 9))  # evicts the new chunk 0 to SSD
        assert chunks.tiers(client, [0]) == [Tier.SSD]
        assert client.get_whole_chunks(ns, [key]) == [new]


def test_a_pinned_chunk_stays_in_dram_until_unpinned(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    with four_chunk_daemon(daemon_factory, chunk_set, 2) as (_, chunks, client):
        ns = chunks.namespace
        assert client.pin(ns, [chunks.key(0), bytes(32)]) == 1  # absent keys are ignored
        assert client.stats().pinned_chunks == 1
        put_one_by_one(client, chunks, range(2, 10))
        assert chunks.tiers(client, [0, 1]) == [Tier.DRAM, Tier.SSD]

        # Pinning an SSD-only chunk loads it back into DRAM.
        assert client.pin(ns, [chunks.key(1)]) == 1
        poll_until(lambda: chunks.tiers(client, [1]) == [Tier.DRAM], what="the pinned chunk 1 to reach DRAM")
        put_one_by_one(client, chunks, range(10, 14))
        assert chunks.tiers(client, [0, 1]) == [Tier.DRAM, Tier.DRAM]
        assert client.stats().pinned_chunks == 2

        assert client.unpin(ns, chunks.keys(0, 3)) == 2
        assert client.stats().pinned_chunks == 0
        put_one_by_one(client, chunks, range(14, 20))
        assert chunks.tiers(client, [0, 1]) == [Tier.SSD, Tier.SSD]
        assert client.get_whole_chunks(ns, chunks.keys(0, 2)) == [chunks.data(0), chunks.data(1)]


def test_a_chunk_deleted_under_a_lease_stays_readable_by_it_then_is_freed(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], raw_stub: Callable[[DaemonProcess], KVStoreStub]
) -> None:
    with four_chunk_daemon(daemon_factory, chunk_set, 1) as (daemon, chunks, client):
        ns, key, data = chunks.namespace, chunks.key(0), chunks.data(0)
        stub = raw_stub(daemon)
        lease = stub.GetShm(pb.GetShmRequest(namespace=ns, keys=[key]))
        assert client.delete(ns, [key]) == 1
        assert client.lookup(ns, [key]).prefix_length == 0  # hidden at once
        with pytest.raises(grpc.RpcError) as failed:
            client.get_whole_chunks(ns, [key])
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        arena = map_arena(stub)
        try:
            assert arena.read(extents_of(lease.chunks[0]), 0, len(data)) == data  # the reader's bytes stay
        finally:
            arena.close()
        assert client.stats().dram.used_bytes == MiB

        assert release(stub, lease.lease_id)
        stats = client.stats()
        assert stats.dram.used_bytes == 0 and stats.dram.chunks == 0  # freed with the last reader
        assert client.put_chunks(ns, {key: data}).stored == [key]
        assert client.get_whole_chunks(ns, [key]) == [data]
