"""The daemon's Prometheus endpoint reports per-tier counters and per-method latency."""

from __future__ import annotations

import socket
import urllib.request
from typing import TYPE_CHECKING

from attnstore.kvstore_client import KVStoreClient

if TYPE_CHECKING:
    from conftest import ChunkSet, DaemonFactory


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_metrics_endpoint_counts_hits_bytes_and_latency(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    port = free_port()
    daemon = daemon_factory(METRICS_PORT=port)
    chunks = chunk_set(num_layers=2, kv_heads=2, head_dim=8, chunk_tokens=16)
    keys = chunks.keys(0, 3)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 3))
        client.get_whole_chunks(chunks.namespace, keys)
        assert client.lookup(chunks.namespace, [*keys, bytes(32)]).prefix_length == 3
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['attnstore_kvstore_hits_total{tier="dram"}'] >= 6  # 3 read + 3 looked up
    assert samples["attnstore_kvstore_misses_total"] >= 1
    written = sum(len(chunks.data(i)) for i in range(3))
    assert samples['attnstore_kvstore_bytes_in_total{transport="shm"}'] == written
    assert samples['attnstore_kvstore_bytes_out_total{transport="shm"}'] >= written
    assert samples['attnstore_rpc_duration_seconds_count{code="OK",method="CommitPut"}'] == 1
    assert samples['attnstore_kvstore_capacity_bytes{tier="dram"}'] > 0
