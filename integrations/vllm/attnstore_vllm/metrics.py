"""Prometheus metrics of the connector (both roles; vLLM's own /metrics serves them when the
engine runs in the server's process or with PROMETHEUS_MULTIPROC_DIR)."""

from __future__ import annotations

from prometheus_client import Counter

LOOKUPS = Counter("attnstore_vllm_lookups_total", "Requests looked up in the daemon")
LOOKUP_ERRORS = Counter("attnstore_vllm_lookup_errors_total", "Lookups that failed (answered as a miss)")
HIT_TOKENS = Counter("attnstore_vllm_hit_tokens_total", "Prompt tokens vLLM was told to load from the daemon")
LOADED_CHUNKS = Counter("attnstore_vllm_loaded_chunks_total", "Chunks loaded into vLLM's blocks")
LOAD_BYTES = Counter("attnstore_vllm_load_bytes_total", "Chunk layer bytes loaded into vLLM's blocks")
LOAD_SECONDS = Counter("attnstore_vllm_load_seconds_total", "Time from the start of a load to its last layer")
LOAD_ERRORS = Counter(
    "attnstore_vllm_load_errors_total", "Loads that failed; their blocks were recomputed by vLLM"
)
SAVED_CHUNKS = Counter("attnstore_vllm_saved_chunks_total", "Chunks the daemon stored from vLLM")
SAVE_BYTES = Counter("attnstore_vllm_save_bytes_total", "Serialized chunk bytes sent to the daemon")
SAVE_SECONDS = Counter("attnstore_vllm_save_seconds_total", "Time encoding and putting chunks (off the step)")
SAVE_ERRORS = Counter(
    "attnstore_vllm_save_errors_total", "Chunk puts that failed (their KV is recomputed later)"
)
SAVES_DROPPED = Counter(
    "attnstore_vllm_saves_dropped_total", "Chunks not saved because max_pending_save_bytes was reached"
)
