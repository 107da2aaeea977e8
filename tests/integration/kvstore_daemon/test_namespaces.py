"""The namespace table of a real daemon (issue 26, point 1): idle, empty namespaces are
reclaimed least recently used first when the table is full, namespaces holding chunks
never are, a refused registration is a readable RESOURCE_EXHAUSTED that is counted (Stats,
/metrics, `attnstore status`), new registrations are rate-limited per caller, a reclaimed
name registered again with another layout never sees old chunks, and the namespace file
agrees with what a restarted daemon serves."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING

import grpc
import pytest
from service_probes import scrape_metrics

from attnstore.kvstore_client import KVStoreClient, Tier

if TYPE_CHECKING:  # the fixtures' types; conftest modules are not imported by name
    from conftest import ChunkSet, DaemonFactory

IDLE_SECONDS = 0.5
REFUSED = "attnstore_kvstore_namespace_registrations_refused_total"


def ns(index: int) -> bytes:
    return bytes([index]) * 16


def register(client: KVStoreClient, chunks: ChunkSet, namespace: bytes) -> int:
    return client.register_namespace(namespace, **chunks.layout)


def refused(client: KVStoreClient, chunks: ChunkSet, namespace: bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refusal:
        register(client, chunks, namespace)
    assert refusal.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return refusal.value


def known(client: KVStoreClient, namespace: bytes) -> bool:
    try:
        client.lookup(namespace, [bytes(32)])
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND and "unknown namespace" in (exc.details() or "")
        return False
    return True


def test_a_full_table_reclaims_idle_empty_namespaces_lru_first_and_counts_refusals(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    daemon = daemon_factory(MAX_NAMESPACES=4, NAMESPACE_IDLE_SECONDS=IDLE_SECONDS, METRICS_PORT=0)
    port = daemon.metrics_port
    chunks = chunk_set(ns(1))
    with KVStoreClient(daemon.address) as client:
        for index in (1, 2, 3, 4):
            register(client, chunks, ns(index))
        client.put_chunks(ns(1), chunks.items(0, 2))  # 1 holds chunks
        assert known(client, ns(2))  # a use: 2 is now the most recent; LRU order 3, 4, 1, 2

        message = refused(client, chunks, ns(5)).details() or ""  # none idle yet
        assert "maximum of 4 namespaces (max_namespaces)" in message
        assert "namespace_idle_seconds" in message and "not registered" in message

        time.sleep(IDLE_SECONDS + 0.1)  # the idle period has to pass
        for new, reclaimed in ((5, 3), (6, 4), (7, 2)):  # 1 is older than 2 but holds chunks
            register(client, chunks, ns(new))
            assert not known(client, ns(reclaimed)), f"namespace {reclaimed} should have been reclaimed"
        refused(client, chunks, ns(8))  # 1 holds chunks; 5, 6, 7 are in use

        assert [known(client, ns(i)) for i in (1, 5, 6, 7)] == [True] * 4
        assert client.get_whole_chunks(ns(1), chunks.keys(0, 2)) == [chunks.data(0), chunks.data(1)]
        stats = client.stats()
        assert (stats.namespaces, stats.max_namespaces, stats.namespaces_reclaimed) == (4, 4, 3)
        assert (stats.namespaces_refused_table_full, stats.namespaces_refused_rate_limited) == (2, 0)
    samples = scrape_metrics(port)
    assert samples[f'{REFUSED}{{reason="table_full"}}'] == 2
    assert samples["attnstore_kvstore_namespaces_reclaimed_total"] == 3
    assert samples["attnstore_kvstore_namespaces"] == 4

    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnstore_cli.main",
            "status",
            "--daemon",
            daemon.address,
            "--address",
            "127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "namespaces: 4 of 4, 3 reclaimed, 2 refused (2 table full, 0 rate limited)" in status.stdout, (
        status.stdout + status.stderr
    )


def test_new_registrations_are_rate_limited_per_caller(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    daemon = daemon_factory(NAMESPACE_REGISTRATIONS_PER_SECOND=2, NAMESPACE_REGISTRATION_BURST=3)
    chunks = chunk_set()
    with KVStoreClient(daemon.address) as client:
        for index in (1, 2, 3):
            register(client, chunks, ns(index))
        message = refused(client, chunks, ns(4)).details() or ""
        assert "faster than 2/s (namespace_registrations_per_second, burst 3); retry in" in message
        register(client, chunks, ns(1))  # registering a known namespace again costs nothing
        assert not known(client, ns(4))
        time.sleep(0.6)  # one registration's worth of rate (0.5 s) comes back
        register(client, chunks, ns(4))
        stats = client.stats()
        assert (stats.namespaces, stats.namespaces_refused_rate_limited) == (4, 1)


def test_a_reclaimed_name_registered_with_another_layout_never_sees_old_chunks(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    daemon = daemon_factory(MAX_NAMESPACES=2, NAMESPACE_IDLE_SECONDS=IDLE_SECONDS)
    old = chunk_set(ns(1))
    wider = chunk_set(ns(1), head_dim=64)  # the same name and keys, another geometry
    with KVStoreClient(daemon.address) as client:
        old.register(client)
        register(client, old, ns(2))
        client.put_chunks(ns(1), old.items(0, 3), durable=True)
        assert known(client, ns(2))  # LRU order: 1, 2
        time.sleep(IDLE_SECONDS + 0.1)
        register(client, old, ns(3))  # 1 is older but holds chunks (DRAM and SSD): 2 goes
        assert [known(client, ns(i)) for i in (1, 2)] == [True, False]
        assert old.tiers(client, range(3)) == [Tier.DRAM] * 3

        assert client.delete(ns(1), old.keys(0, 3)) == 3  # now 1 is empty
        assert known(client, ns(3))  # LRU order: 1, 3
        time.sleep(IDLE_SECONDS + 0.1)
        register(client, old, ns(4))  # reclaims 1
        assert not known(client, ns(1))
        assert wider.register(client) > 0  # reclaims 3; no ALREADY_EXISTS: the old layout is gone
        assert client.lookup(ns(1), wider.keys(0, 3)).prefix_length == 0
        with pytest.raises(grpc.RpcError) as missing:
            client.get_whole_chunks(ns(1), wider.keys(0, 1))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        client.put_chunks(ns(1), wider.items(0, 2), durable=True)

    daemon.kill9()  # a crash: every acknowledged registration and reclaim is in the file
    daemon.start()  # it names 4 and 1 (wider): exactly what the restarted daemon knows
    with KVStoreClient(daemon.address) as client:
        assert [known(client, ns(i)) for i in (1, 2, 3, 4)] == [True, False, False, True]
        assert wider.tiers(client, range(3)) == [Tier.SSD, Tier.SSD, None]
        assert client.get_whole_chunks(ns(1), wider.keys(0, 2)) == [wider.data(0), wider.data(1)]


def test_chunks_of_a_namespace_the_file_does_not_name_are_dropped_at_start(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    """A crash between forgetting a namespace and unlinking its last files (or a lost
    namespace file) leaves chunks no registration describes: a restart deletes them, so a
    registration of that name with another layout cannot be served them."""
    daemon = daemon_factory()
    old, wider = chunk_set(ns(1)), chunk_set(ns(1), head_dim=64)
    with KVStoreClient(daemon.address) as client:
        old.register(client)
        client.put_chunks(ns(1), old.items(0, 3), durable=True)
    assert daemon.stop() == 0
    (daemon.ssd_dir / "namespaces.msgpack").unlink()
    assert len(list(daemon.ssd_dir.glob("chunks/*/*.chunk"))) == 3
    daemon.start()
    with KVStoreClient(daemon.address) as client:
        assert not known(client, ns(1))
        wider.register(client)
        assert client.lookup(ns(1), old.keys(0, 3)).prefix_length == 0
        assert client.stats().ssd.chunks == 0
    assert list(daemon.ssd_dir.glob("chunks/*/*.chunk")) == []
