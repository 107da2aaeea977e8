"""bench-pool's worker replay (later-turn TTFT): its prompts, the lenders' chunks
shaped as the worker's, and the node sizes both replays share."""

from __future__ import annotations

import pytest

from attnstore.chunks.format import decode_layout
from attnstore.chunks.keys import KEY_BYTES
from bench.hitrate.workloads import SHAREGPT_CHUNK_TOKENS, Workload, load_sharegpt
from bench.pool import pooled_ttft as ttft
from bench.pool.pooled import SHAREGPT
from bench.pool.pooled_layouts import MiB, node_settings


@pytest.fixture(scope="module")
def workload() -> Workload:
    return load_sharegpt(**{**SHAREGPT, "conversations": ttft.TTFT_CONVERSATIONS})


def test_the_replays_prompts_fit_the_model_and_a_nodes_dram(workload: Workload) -> None:
    assert ttft.longest_prompt(workload) <= ttft.MAX_PROMPT_TOKENS


def test_a_turns_prompt_extends_the_previous_one(workload: Workload) -> None:
    """The worker reuses the previous prompt's full chunks only if it is a prefix."""
    for session in workload.sessions:
        lengths = [ttft._prompt_tokens(turn) for turn in session.turns]
        assert lengths == sorted(lengths)
        assert all(length % SHAREGPT_CHUNK_TOKENS == ttft.TAIL_TOKENS for length in lengths)


def test_the_lenders_chunks_are_the_workers_size_and_layout() -> None:
    chunks, size = ttft.lender_chunks()
    head_dim = ttft.MODEL["hidden_size"] // ttft.MODEL["num_attention_heads"]
    assert chunks.layout == {
        "num_layers": ttft.MODEL["num_hidden_layers"], "kv_heads": ttft.MODEL["num_key_value_heads"], "head_dim": head_dim,
        "chunk_tokens": SHAREGPT_CHUNK_TOKENS, "dtype": "float32",
    }  # fmt: skip
    data = chunks.encode(bytes(KEY_BYTES))
    layout = decode_layout(data)
    kv_bytes = (
        2
        * ttft.MODEL["num_hidden_layers"]
        * ttft.MODEL["num_key_value_heads"]
        * SHAREGPT_CHUNK_TOKENS
        * head_dim
        * 4
    )
    assert layout.total_bytes == len(data) == layout.data_offset + kv_bytes
    assert len(data) <= size < len(data) + 4096  # a block holds any chunk of the shape


def test_a_node_is_its_chunks_in_dram_and_ssd() -> None:
    settings = node_settings(64, 528_384, dram_bytes=24 * 528_384, nodes=3)
    assert settings["dram_capacity_bytes"] + settings["ssd_capacity_bytes"] == 3 * 64 * 528_384  # type: ignore[operator]
    assert settings["dram_block_bytes"] == settings["max_chunk_bytes"] == 528_384
    with pytest.raises(ValueError, match="1 MiB minimum"):
        node_settings(4, MiB // 4, dram_bytes=MiB)
