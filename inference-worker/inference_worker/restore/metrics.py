"""Prometheus metrics of restores from hidden states (HCache): the plans chosen, the time
spent by each method, the bytes hidden states saved over KV."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from inference_worker.restore.loader import RestoreStats

_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

RESTORE_PLANS = Counter(
    "attnstore_worker_restore_plans_total",
    "Restores by the method the planner chose (recompute, hidden, kv, mix)",
    ["method"],
)
RESTORE_SECONDS = Histogram(
    "attnstore_worker_restore_seconds",
    "Time one restore spent in each method (compute for recompute and hidden, reads for kv)",
    ["method"],
    buckets=_SECONDS_BUCKETS,
)
RESTORE_READ_BYTES = Counter(
    "attnstore_worker_restore_read_bytes_total", "Bytes restores read from the store"
)
STORED_BYTES_SAVED = Counter(
    "attnstore_worker_restore_stored_bytes_saved_total",
    "Bytes the storage plan saved on the chunks it stored, against storing their KV",
)


def observe_restore(stats: RestoreStats) -> None:
    RESTORE_PLANS.labels(stats.plan.method).inc()
    RESTORE_READ_BYTES.inc(stats.bytes_read)
    for method, seconds in stats.seconds.items():
        if seconds:
            RESTORE_SECONDS.labels(method).observe(seconds)


def observe_saved(kv_bytes: int, stored_bytes: int) -> None:
    STORED_BYTES_SAVED.inc(max(kv_bytes - stored_bytes, 0))
