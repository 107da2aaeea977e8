"""bench-batch's device row (bench/batch/device_row.py) on the CPU with a tiny config: each
level and the batch-1 engine get a row, and every turn writes exactly max_tokens (random
weights and no stop tokens, which the throughput comparison relies on)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig

from bench.batch.device_row import run

TINY = LlamaConfig(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
    max_position_embeddings=128,
)


async def test_every_turn_writes_max_tokens_and_each_level_gets_a_row() -> None:
    workload = {
        "config": TINY.to_dict(),
        # level 1: one session of two turns, the second's prompt extending the first's
        "levels": {"1": [[[1, 2, 3], [1, 2, 3, 9, 4]]], "16": [[[5, 6, 7]], [[8, 9]]]},
        "batch1": [[[10, 11, 12]], [[13]]],
    }
    rows = await run(workload, torch.device("cpu"), max_tokens=3, kv_memory_bytes=1 << 20)
    assert list(rows) == ["engine@1", "engine@16", "batch1@16"]
    assert [row["output_tokens"] for row in rows.values()] == [6, 6, 6]
    assert all(row["tokens_per_s"] > 0 for row in rows.values())
