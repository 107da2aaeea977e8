"""bench.peers.turn_split reads the worker's own histograms over HTTP, as the worker serves
them (prometheus_client's server on the process's registry, where inference_worker.metrics
registers them); the stack run itself is a diagnosis run by hand."""

from __future__ import annotations

import pytest
from prometheus_client import start_http_server

from bench.peers.turn_split import HISTOGRAMS, histogram_sums
from inference_worker import metrics


def test_histogram_sums_move_by_what_a_turn_observed() -> None:
    server, thread = start_http_server(0, addr="127.0.0.1")
    try:
        port = server.server_port
        before = histogram_sums(port)
        assert set(before) == set(HISTOGRAMS)
        metrics.TTFT_SECONDS.observe(0.25)
        metrics.COMPUTE_SECONDS.observe(0.2)
        metrics.KV_LOAD_EXPOSED_SECONDS.observe(0.01)
        after = histogram_sums(port)
    finally:
        server.shutdown()
        thread.join()
    moved = {name: after[name] - before[name] for name in HISTOGRAMS}
    assert moved == pytest.approx(
        {"worker_ttft": 0.25, "compute": 0.2, "kv_load": 0.0, "kv_load_exposed": 0.01}
    )
