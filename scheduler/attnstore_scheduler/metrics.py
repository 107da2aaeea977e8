"""Prometheus metrics of the scheduler (per-method latency comes from the shared
interceptor)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)

QUEUE_LENGTH = Gauge("attnstore_scheduler_queue_length", "Turns waiting for a worker")
QUEUE_WAIT_SECONDS = Histogram(
    "attnstore_scheduler_queue_wait_seconds", "Time a turn waited for a worker", buckets=_SECONDS_BUCKETS
)
TTFT_SECONDS = Histogram(
    "attnstore_scheduler_ttft_seconds",
    "Request received to first token sent, queueing included",
    ["kind"],
    buckets=_SECONDS_BUCKETS,
)
HIT_RATIO = Histogram(
    "attnstore_scheduler_reused_token_ratio",
    "Reused prompt tokens / prompt tokens of a turn",
    ["kind"],
    buckets=_RATIO_BUCKETS,
)
PROMPT_TOKENS = Counter("attnstore_scheduler_prompt_tokens_total", "Prompt tokens of completed turns")
REUSED_TOKENS = Counter("attnstore_scheduler_reused_tokens_total", "Prompt tokens whose KV was reused")
ROUTES = Counter(
    "attnstore_scheduler_routing_decisions_total",
    "Worker choices: affinity (the session's node), load (least loaded), retry (after a failure)",
    ["decision"],
)
POOL_MOVES = Counter(
    "attnstore_scheduler_pool_moves_total",
    "Turns sent to a pool peer's node because it holds the session's KV (pool_routing.py)",
)
TURNS = Counter("attnstore_scheduler_turns_total", "Turns by kind and outcome", ["kind", "outcome"])
WORKER_FAILURES = Counter(
    "attnstore_scheduler_worker_failures_total", "Worker attempts that failed mid-turn", ["code"]
)
HEALTHY_WORKERS = Gauge("attnstore_scheduler_healthy_workers", "Workers answering their health check")
SESSIONS_CREATED = Counter("attnstore_scheduler_sessions_created_total", "Sessions created")
SESSIONS_ENDED = Counter("attnstore_scheduler_sessions_ended_total", "Sessions ended", ["reason"])
RELEASED_CHUNKS = Counter(
    "attnstore_scheduler_released_chunks_total", "Chunks of ended sessions released on their daemon"
)
