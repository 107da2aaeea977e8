"""bench-batch's memory part (memory.py's measurements on ShareGPT token ids, workload.py):
waste, shared-prefix capacity and parallel-sampling savings, as one dict for the results."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from bench.batch.memory import parallel_sampling_saving, replay_waste, sessions_that_fit
from bench.batch.stats import ratio
from bench.batch.workload import system_prompt_text, token_conversations

SAMPLES = (2, 4, 6)


@dataclass(frozen=True)
class MemoryConfig:
    block_tokens: int  # the worker's default pool block
    max_batch_tokens: int  # the worker's default
    pool_blocks: int  # the replays' pool: room for every sequence they hold at once
    capacity_pool_blocks: int  # the pool the sessions are fitted into
    kv_bytes_per_token: int
    system_prompt_tokens: int
    conversations: int  # per measurement
    waste_concurrency: int
    max_turns: int
    max_prompt_tokens: int
    max_answer_tokens: int
    seed: int


def measure_memory(tokenizer: PreTrainedTokenizerBase, config: MemoryConfig) -> dict[str, Any]:
    system = system_prompt_text(tokenizer, config.system_prompt_tokens, seed=config.seed)
    limits = {
        "count": config.conversations,
        "seed": config.seed,
        "max_turns": config.max_turns,
        "max_prompt_tokens": config.max_prompt_tokens,
        "max_answer_tokens": config.max_answer_tokens,
    }
    plain = token_conversations(tokenizer, system_prompt=None, **limits)
    with_system = token_conversations(tokenizer, system_prompt=system, **limits)

    requests = [turn for conversation in plain for turn in conversation.turns]
    waste = replay_waste(
        requests,
        concurrency=config.waste_concurrency,
        block_tokens=config.block_tokens,
        num_blocks=config.pool_blocks,
        max_batch_tokens=config.max_batch_tokens,
    )

    sessions = [conversation.tokens for conversation in with_system]
    fit = {
        share: sessions_that_fit(sessions, config.capacity_pool_blocks, config.block_tokens, share=share)
        for share in (True, False)
    }

    first_turns = {
        "sharegpt_first_turns": [c.turns[0] for c in plain],
        "with_shared_system_prompt": [c.turns[0] for c in with_system],
    }
    sampling = {
        name: {
            "prompt_tokens_median": statistics.median(len(r.prompt) for r in requests_),
            "answer_tokens_median": statistics.median(len(r.answer) for r in requests_),
            "saved_fraction": {
                n: parallel_sampling_saving(requests_, n, config.block_tokens) for n in SAMPLES
            },
        }
        for name, requests_ in first_turns.items()
    }
    return {
        "kv_waste_fraction": round(float(np.mean(waste)), 4),
        "kv_waste_fraction_max": round(max(waste), 4),
        "waste_steps": len(waste),
        "waste_turns": len(requests),
        "system_prompt_tokens": len(with_system[0].system),
        "session_tokens_median": statistics.median(len(s) for s in sessions),
        "capacity_pool_blocks": config.capacity_pool_blocks,
        "capacity_pool_bytes": config.capacity_pool_blocks * config.block_tokens * config.kv_bytes_per_token,
        "sessions_fit_shared": fit[True],
        "sessions_fit_unshared": fit[False],
        "shared_prefix_capacity_gain": ratio(fit[True], fit[False]),
        "parallel_sampling": sampling,
    }
