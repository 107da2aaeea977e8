"""A daemon whose DRAM tier holds exactly four chunks, shared by the integration tests of
leases and lease-free reads (tests/ is on sys.path through the root conftest).

900 KiB chunks (7 layers of 128 KiB and a 4 KiB header) in 256 KiB blocks: the 4 MiB
arena holds exactly four. Evictions happen only to make room (no watermark demotion), in
LRU order, and demote to SSD."""

from __future__ import annotations

KiB, MiB = 1024, 1024 * 1024
SHAPE = {"num_layers": 7, "kv_heads": 4, "head_dim": 128, "chunk_tokens": 64}
FOUR_CHUNK_DRAM = {
    "DRAM_CAPACITY_BYTES": 4 * MiB,
    "DRAM_BLOCK_BYTES": 256 * KiB,
    "MAX_CHUNK_BYTES": MiB,
    "DRAM_HIGH_WATERMARK": 1.0,
    "DRAM_LOW_WATERMARK": 1.0,
    "PERSIST_ON_COMMIT": "false",
    "EVICTION_POLICY": "lru",
}
