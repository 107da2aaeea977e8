"""Reading again without a lease: a client that leased a chunk before copies it straight
from the arena and keeps the copy only if the chunk's block versions did not change
(attnstore.shm_arena.BlockVersions). These tests stop the daemon to prove no round trip
is made, and move, delete and overwrite chunks under a reader to prove a stale location
is never served."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import grpc
import pytest
from machine import LEASE_FREE_READS, LEASE_FREE_READS_REASON
from service_probes import scrape_metrics
from small_arena import FOUR_CHUNK_DRAM, SHAPE, MiB

from attnstore.chunks.format import decode_layout
from attnstore.kvstore.v1 import kvstore_pb2 as pb
from attnstore.kvstore_client import KVStoreClient, Tier

if TYPE_CHECKING:  # the fixtures' types; conftest modules are not imported by name
    from collections.abc import Callable

    from conftest import ChunkSet, DaemonFactory, DaemonProcess, PollUntil

    from attnstore.kvstore.v1.kvstore_pb2_grpc import KVStoreStub

pytestmark = pytest.mark.skipif(not LEASE_FREE_READS, reason=LEASE_FREE_READS_REASON)

# Four chunks in DRAM, and an SSD tier that never fills during a test.
SMALL_DRAM_ROOMY_SSD = {**FOUR_CHUNK_DRAM, "SSD_CAPACITY_BYTES": 1024 * MiB}

# Churns the same arena from another process: puts fresh chunks of another namespace,
# deleting every other one, so the reader's chunks are demoted, promoted and their blocks
# rewritten while it reads.
CHURN = """
import os, sys, time
from attnstore.chunks.format import encode_chunk
from attnstore.kvstore_client import KVStoreClient
address, seconds = sys.argv[1], float(sys.argv[2])
namespace, half = b"churn-namespace!", 4 * 64 * 128 * 2
with KVStoreClient(address) as client:
    client.register_namespace(namespace, num_layers=7, kv_heads=4, head_dim=128, chunk_tokens=64, dtype="float16")
    deadline, count = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        key = count.to_bytes(32, "big")
        layers = [(os.urandom(half), os.urandom(half)) for _ in range(7)]
        data = encode_chunk(namespace=namespace, key=key, dtype="float16", kv_heads=4, tokens=64,
                            head_dim=128, base_position=0, layers=layers)
        client.put_chunks(namespace, {key: data})
        if count % 2:
            client.delete(namespace, [key])
        count += 1
print(count)
"""


class DaemonCounters:
    """The daemon's GetShm calls and DRAM hits, from its Prometheus endpoint."""

    def __init__(self, daemon_factory: DaemonFactory, **settings: object) -> None:
        self.daemon = daemon_factory(METRICS_PORT=0, **settings)
        self.port = self.daemon.metrics_port

    def get_shm_calls(self) -> int:
        return int(
            scrape_metrics(self.port).get(
                'attnstore_rpc_duration_seconds_count{code="OK",method="GetShm"}', 0
            )
        )

    def dram_hits(self) -> int:
        return int(scrape_metrics(self.port)['attnstore_kvstore_hits_total{tier="dram"}'])


def test_reading_a_leased_chunk_again_needs_no_daemon(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    counters = DaemonCounters(daemon_factory)
    daemon, chunks = counters.daemon, chunk_set()
    keys, expected = chunks.keys(0, 3), [chunks.data(i) for i in range(3)]
    layout = decode_layout(expected[1])
    first, last = layout.layer_span(1, 3)
    assert daemon.pid is not None
    with KVStoreClient(daemon.address, timeout_seconds=2) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 3))
        assert client.get_whole_chunks(chunks.namespace, keys) == expected  # leased: locations learned
        calls, hits = counters.get_shm_calls(), counters.dram_hits()
        os.kill(daemon.pid, signal.SIGSTOP)  # any round trip now waits for SIGCONT
        try:
            for _ in range(3):
                assert client.get_whole_chunks(chunks.namespace, keys) == expected
            piece = client.get_chunks(chunks.namespace, keys[1:2], layer_start=1, layer_end=3)[0]
            assert bytes(piece.data) == expected[1][first:last]
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
        # The reads are reported afterwards (one ReleaseLease): counted as DRAM hits, no GetShm.
        poll_until(lambda: counters.dram_hits() == hits + 3, what="the lease-free reads to be reported")
        assert counters.get_shm_calls() == calls


def test_without_the_location_cache_every_read_is_leased(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    counters = DaemonCounters(daemon_factory)
    chunks = chunk_set()
    with KVStoreClient(counters.daemon.address, location_cache_entries=0) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 1))
        calls = counters.get_shm_calls()
        for _ in range(3):
            assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 1)) == [chunks.data(0)]
        assert counters.get_shm_calls() == calls + 3


def test_reported_lease_free_reads_keep_a_chunk_recent_for_lru(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    counters = DaemonCounters(daemon_factory, **SMALL_DRAM_ROOMY_SSD)
    chunks = chunk_set(**SHAPE)
    with KVStoreClient(counters.daemon.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 1))
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 1)) == [chunks.data(0)]
        for index in (1, 2, 3):  # DRAM is full; chunk 0 is the least recently used
            client.put_chunks(chunks.namespace, chunks.items(index, index + 1))
        hits = counters.dram_hits()
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 1)) == [chunks.data(0)]  # lease-free
        poll_until(lambda: counters.dram_hits() == hits + 1, what="the lease-free read to be reported")
        client.put_chunks(chunks.namespace, chunks.items(4, 5))  # evicts the least recently used
        assert chunks.tiers(client, range(5)) == [Tier.DRAM, Tier.SSD, Tier.DRAM, Tier.DRAM, Tier.DRAM]


def test_a_deleted_chunk_is_not_read_from_where_it_was(
    daemon: DaemonProcess, chunk_set: type[ChunkSet], raw_stub: Callable[[DaemonProcess], KVStoreStub]
) -> None:
    chunks = chunk_set()
    keys = chunks.keys(0, 2)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 2))
        assert client.get_whole_chunks(chunks.namespace, keys) == [chunks.data(0), chunks.data(1)]
        # Chunk 1 stays leased by another reader, so its blocks are not freed yet: the
        # delete alone must end lease-free reads of it.
        holder = raw_stub(daemon).GetShm(pb.GetShmRequest(namespace=chunks.namespace, keys=keys[1:]))
        assert client.delete(chunks.namespace, keys) == 2
        for key in keys:
            with pytest.raises(grpc.RpcError) as error:
                client.get_whole_chunks(chunks.namespace, [key])
            assert error.value.code() is grpc.StatusCode.NOT_FOUND
        assert (
            raw_stub(daemon).ReleaseLease(pb.ReleaseLeaseRequest(lease_ids=[holder.lease_id])).released_count
            == 1
        )


def test_a_moved_chunk_is_read_from_its_new_place(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    counters = DaemonCounters(daemon_factory, **SMALL_DRAM_ROOMY_SSD)
    chunks = chunk_set(**SHAPE)
    with KVStoreClient(counters.daemon.address, verify_checksums=False) as client:  # only the versions guard
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 1))
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 1)) == [chunks.data(0)]
        for index in range(1, 9):  # eight more chunks: chunk 0 goes to SSD, its blocks to others
            client.put_chunks(chunks.namespace, chunks.items(index, index + 1))
        assert chunks.tiers(client, [0]) == [Tier.SSD]
        calls = counters.get_shm_calls()
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 1)) == [chunks.data(0)]
        assert counters.get_shm_calls() == calls + 1  # the stale location was refused, then leased


def test_reads_under_churn_from_another_process_are_always_the_stored_bytes(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    counters = DaemonCounters(daemon_factory, **SMALL_DRAM_ROOMY_SSD)
    chunks = chunk_set(**SHAPE)
    keys, expected = chunks.keys(0, 2), [chunks.data(0), chunks.data(1)]
    seconds = 3.0
    with KVStoreClient(counters.daemon.address, verify_checksums=False) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 2))
        calls = counters.get_shm_calls()
        churn = subprocess.Popen(
            [sys.executable, "-c", CHURN, counters.daemon.address, str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        reads, deadline = 0, time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                for index in (0, 1):
                    assert client.get_whole_chunks(chunks.namespace, [keys[index]]) == [expected[index]]
                    reads += 1
        finally:
            out, _ = churn.communicate(timeout=60)
        assert churn.returncode == 0 and int(out) > 8  # the churn really cycled the arena
        leased = counters.get_shm_calls() - calls
        assert 0 < leased < reads, f"{leased} of {reads} reads leased: both paths must have run"


@pytest.mark.parametrize("ending", ["graceful-restart", "kill-9-restart"])
def test_a_restarted_daemons_old_arena_is_not_read(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil, ending: str
) -> None:
    """The client still maps the old arena after a restart, its versions unchanged after a
    crash; but the daemon's lock on that file is gone, so the client leases again and the
    chunk, never written to SSD, is not found instead of being served from a dead daemon's
    memory."""
    daemon = daemon_factory(PERSIST_ON_COMMIT="false")
    chunks = chunk_set()
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 1))
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 1)) == [chunks.data(0)]
        # The lease's release goes out first: one sent while the daemon is down would put
        # the channel in reconnect backoff and fail the calls below.
        poll_until(lambda: client.stats().leases == 0, what="the read's lease to be released")
        if ending == "graceful-restart":
            daemon.restart()
        else:
            daemon.kill9()
            daemon.start()
        chunks.register(client)  # namespaces persist; the chunk did not

        with pytest.raises(grpc.RpcError) as error:
            client.get_whole_chunks(chunks.namespace, chunks.keys(0, 1))
        assert error.value.code() is grpc.StatusCode.NOT_FOUND
