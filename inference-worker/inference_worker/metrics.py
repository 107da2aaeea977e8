"""Prometheus metrics of the worker, observed from each turn's stats at the gRPC edge
(per-method latency comes from the shared interceptor), and the engine's, observed by its
step loop (engine/engine.py)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from inference_worker.turn_types import TurnStats

_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)

TURNS = Counter("attnstore_worker_turns_total", "Turns completed, by finish reason", ["finish_reason"])
FALLBACKS = Counter(
    "attnstore_worker_fallbacks_total",
    "Turns that recomputed instead of reusing stored KV, by reason",
    ["reason"],
)
PROMPT_TOKENS = Counter("attnstore_worker_prompt_tokens_total", "Prompt tokens of completed turns")
TRUNCATED_TOKENS = Counter(
    "attnstore_worker_truncated_tokens_total", "Prompt tokens dropped by context-overflow truncation"
)
REUSED_TOKENS = Counter("attnstore_worker_reused_tokens_total", "Prompt tokens whose KV came from the store")
GENERATED_TOKENS = Counter("attnstore_worker_generated_tokens_total", "Tokens generated")
SAVED_CHUNKS = Counter("attnstore_worker_saved_chunks_total", "New full chunks handed to the daemon")
DGFM_RECALLED_BYTES = Counter(
    "attnstore_worker_dgfm_recalled_bytes_total", "KV of this worker's long turns brought home by DGFM swaps"
)
DGFM_ROUND_FAILURES = Counter(
    "attnstore_worker_dgfm_round_failures_total", "DGFM periods that stopped on an error (logged)"
)
TTFT_SECONDS = Histogram("attnstore_worker_ttft_seconds", "Time to first token", buckets=_SECONDS_BUCKETS)
REUSED_RATIO = Histogram(
    "attnstore_worker_reused_token_ratio",
    "Share of a turn's kept (after truncation) prompt tokens reused from the store",
    buckets=_RATIO_BUCKETS,
)
KV_LOAD_SECONDS = Histogram(
    "attnstore_worker_kv_load_seconds",
    "Loading a turn's reused KV (mostly hidden behind compute)",
    buckets=_SECONDS_BUCKETS,
)
KV_LOAD_EXPOSED_SECONDS = Histogram(
    "attnstore_worker_kv_load_exposed_seconds",
    "The part of KV loading the forward pass waited for",
    buckets=_SECONDS_BUCKETS,
)
COMPUTE_SECONDS = Histogram(
    "attnstore_worker_prefill_compute_seconds",
    "Prefill compute over a turn's new tokens",
    buckets=_SECONDS_BUCKETS,
)

BATCH_SEQUENCES = Histogram(
    "attnstore_worker_batch_sequences",
    "Sequences in one forward pass of the engine",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
RUNNING_SEQUENCES = Gauge("attnstore_worker_running_sequences", "Sequences holding KV blocks and running")
WAITING_SEQUENCES = Gauge(
    "attnstore_worker_waiting_sequences", "Sequences waiting for KV blocks or a batch slot"
)
POOL_BLOCKS = Gauge("attnstore_worker_pool_blocks", "KV pool blocks by state (used, free, shared)", ["state"])
PREEMPTIONS = Counter(
    "attnstore_worker_preemptions_total", "Sequences whose blocks were taken back when the pool ran out"
)


def observe_turn(stats: TurnStats) -> None:
    TURNS.labels(stats.finish_reason).inc()
    if stats.fallback is not None:
        FALLBACKS.labels(stats.fallback.value).inc()
    PROMPT_TOKENS.inc(stats.prompt_tokens)
    TRUNCATED_TOKENS.inc(stats.truncated_tokens)
    REUSED_TOKENS.inc(stats.reused_tokens)
    GENERATED_TOKENS.inc(stats.generated_tokens)
    SAVED_CHUNKS.inc(stats.saved_chunks)
    TTFT_SECONDS.observe(stats.ttft_seconds)
    kept_tokens = stats.prompt_tokens - stats.truncated_tokens  # what the turn ran
    if kept_tokens:
        REUSED_RATIO.observe(stats.reused_tokens / kept_tokens)
    if stats.reused_tokens:  # a turn that loaded nothing says nothing about loading
        KV_LOAD_SECONDS.observe(stats.kv_load_seconds)
        KV_LOAD_EXPOSED_SECONDS.observe(stats.kv_load_exposed_seconds)
    COMPUTE_SECONDS.observe(stats.compute_seconds)
