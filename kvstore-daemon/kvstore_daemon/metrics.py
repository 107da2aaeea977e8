"""Prometheus metrics of the daemon (per-method latency comes from the shared interceptor).

They are the daemon's only counters: the Stats RPC reads them back (`total`), so the two
never disagree. They are process-wide, like the /metrics page: one daemon process holds one
store."""

from prometheus_client import Counter, Gauge, Histogram

HITS = Counter("attnstore_kvstore_hits_total", "Looked-up or read chunks found, by tier", ["tier"])
MISSES = Counter("attnstore_kvstore_misses_total", "Looked-up or read chunks not found")
BYTES_IN = Counter(
    "attnstore_kvstore_bytes_in_total",
    "Chunk bytes received, by transport (shm, grpc, dataplane)",
    ["transport"],
)
BYTES_OUT = Counter("attnstore_kvstore_bytes_out_total", "Chunk bytes served, by transport", ["transport"])
DATA_PLANE_C_READS = Counter(
    "attnstore_kvstore_data_plane_c_reads_total",
    "Chunks the data plane's C read path sent whole (no Python; valid or not)",
)
EVICTIONS = Counter("attnstore_kvstore_evictions_total", "Chunks evicted, by tier", ["tier"])
EVICTION_REASONS = Counter(
    "attnstore_kvstore_eviction_reasons_total",
    "Chunks evicted, by tier and by the victim's hint (unhinted, evict_first, decline, predict, protect, prefetch)",
    ["tier", "reason"],
)
ADMISSIONS_DECLINED = Counter(
    "attnstore_kvstore_admissions_declined_total",
    "Chunks a live DECLINE hint named at reserve: refused, or with declined_admission=ssd_only stored on SSD only",
)
PREDICTED_NEXT_USE = Histogram(
    "attnstore_kvstore_predicted_next_use_seconds",
    "Seconds until predicted use, per PREDICT hint entry received",
    buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
NEXT_USE_ERROR = Histogram(
    "attnstore_kvstore_next_use_error_seconds",
    "Read time minus predicted use time, per read of a PREDICT-hinted key (negative = earlier than predicted)",
    buckets=(-600, -120, -30, -10, -1, 1, 10, 30, 120, 600),
)
ORDER_FOLLOWED = Gauge(
    "attnstore_kvstore_predictive_order_followed",
    "predictive: 1 while the SSD tier follows the predictive order, 0 while it follows LRU (chosen by shadow caches)",
)
SHADOW_HITS = Counter(
    "attnstore_kvstore_shadow_hits_total",
    "predictive: hits of the shadow cache of each order (predictive, lru) on the sampled keys",
    ["order"],
)
ORDER_SWITCHES = Counter(
    "attnstore_kvstore_predictive_order_switches_total",
    "predictive: times the shadow caches switched the SSD tier's order (to the label's order)",
    ["order"],
)
ORDER_REQUESTS = Counter(
    "attnstore_kvstore_predictive_order_requests_total",
    "predictive: sampled requests seen while the SSD tier followed each order (the time spent on it)",
    ["order"],
)
EVICTED_NEEDED_AGAIN = Counter(
    "attnstore_kvstore_evicted_needed_again_total",
    "predictive: evicted or deleted chunks it still remembered (ghosts) that were needed again, learned as reads "
    "at that age; by how it heard: a lookup naming the key beyond its stored prefix (lookup) or a store (store)",
    ["heard"],
)
PROMOTIONS = Counter("attnstore_kvstore_promotions_total", "Chunks copied from SSD to DRAM")
PROMOTIONS_SKIPPED = Counter(
    "attnstore_kvstore_promotions_skipped_total",
    "Background promotions (read-ahead, prefetches) given up for want of DRAM room, by cause: no_evictable_chunk "
    "(all pinned or leased), prefetch_no_victim (none the prefetch may evict: the rest is needed sooner)",
    ["reason"],
)
PREFETCH_MOVES = Counter(
    "attnstore_kvstore_prefetch_moves_total",
    "prefetched chunks (the queue's or predicted) moved from SSD to DRAM (their SSD copy dropped; "
    "persist_on_commit off)",
)
PEER_PLACEMENTS = Counter(
    "attnstore_kvstore_peer_placements_total", "Chunks placed on a peer instead of deleted"
)
PEER_COPIES_FORGOTTEN = Counter(
    "attnstore_kvstore_peer_copies_forgotten_total",
    "Placements forgotten because their lender said it evicted them",
)
LENT_BYTES = Gauge(
    "attnstore_kvstore_lent_bytes", "Bytes held for pool peers, by borrower node", ["borrower"]
)
LENDING_REFUSED = Counter(
    "attnstore_kvstore_lending_refused_total", "Chunks pool peers offered that the lending limits refused"
)
DEMOTIONS = Counter("attnstore_kvstore_demotions_total", "Chunks written to SSD because DRAM evicted them")
CORRUPT = Counter("attnstore_kvstore_corrupt_chunks_total", "Chunks dropped because verification failed")
SSD_WRITE_ERRORS = Counter("attnstore_kvstore_ssd_write_errors_total", "SSD writes the OS refused")
EXPIRED = Counter("attnstore_kvstore_expired_total", "Reservations, leases and pins that timed out", ["kind"])
USED_BYTES = Gauge("attnstore_kvstore_used_bytes", "Bytes in use, by tier", ["tier"])
CAPACITY_BYTES = Gauge("attnstore_kvstore_capacity_bytes", "Configured capacity, by tier", ["tier"])
CHUNKS = Gauge("attnstore_kvstore_chunks", "Committed chunks, by tier", ["tier"])
NAMESPACES = Gauge("attnstore_kvstore_namespaces", "Registered namespaces")
NAMESPACES_RECLAIMED = Counter(
    "attnstore_kvstore_namespaces_reclaimed_total",
    "Idle, empty namespaces forgotten to make room for new ones",
)
NAMESPACE_REFUSALS = Counter(
    "attnstore_kvstore_namespace_registrations_refused_total",
    "New namespaces refused, by reason (table_full, rate_limited)",
    ["reason"],
)


def total(counter: Counter, **labels: str) -> int:
    """The counter's value for `labels` (0 before its first increment)."""
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels == labels:
                return int(sample.value)
    return 0
