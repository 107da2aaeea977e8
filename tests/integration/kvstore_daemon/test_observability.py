"""The daemon's Prometheus endpoint reports per-tier counters and per-method latency."""

from __future__ import annotations

from typing import TYPE_CHECKING

from service_probes import scrape_metrics

from attnstore.kvstore_client import KVStoreClient

if TYPE_CHECKING:
    from conftest import ChunkSet, DaemonFactory


def test_metrics_endpoint_counts_hits_bytes_and_latency(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    daemon = daemon_factory(METRICS_PORT=0)
    port = daemon.metrics_port
    chunks = chunk_set(num_layers=2, kv_heads=2, head_dim=8, chunk_tokens=16)
    keys = chunks.keys(0, 3)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 3))
        client.get_whole_chunks(chunks.namespace, keys)
        assert client.lookup(chunks.namespace, [*keys, bytes(32)]).prefix_length == 3
    samples = scrape_metrics(port)
    assert samples['attnstore_kvstore_hits_total{tier="dram"}'] >= 6  # 3 read + 3 looked up
    assert samples["attnstore_kvstore_misses_total"] >= 1
    written = sum(len(chunks.data(i)) for i in range(3))
    assert samples['attnstore_kvstore_bytes_in_total{transport="shm"}'] == written
    assert samples['attnstore_kvstore_bytes_out_total{transport="shm"}'] >= written
    assert samples['attnstore_rpc_duration_seconds_count{code="OK",method="CommitPut"}'] == 1
    assert samples['attnstore_kvstore_capacity_bytes{tier="dram"}'] > 0
