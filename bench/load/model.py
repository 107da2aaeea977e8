"""The load benchmark's model: a random-weight Llama small enough that two CPU workers
serve hundreds of concurrent sessions, with the real tokenizer and chat template of the
default model (SmolLM2-135M-Instruct), so messages tokenize and template as they would.

Shape (TINY_LLAMA): 4 layers, hidden 64, 4 heads (head_dim 16), 2 KV heads: 1 KiB of fp32
KV per token, and a turn of a short message with 8 new tokens takes tens of milliseconds
on one core. SmolLM2-135M itself prefills at ~2 ms per token and decodes at ~20-40 ms per
token on these 2 cores: two workers would complete a few turns per second, so 256
sessions would wait minutes per turn; the benchmark measures the service, not the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from inference_worker.model_store import default_model_dir

TINY_LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "initializer_range": 0.2,  # peaked logits: greedy answers do not hinge on near ties
    "tie_word_embeddings": True,
}


def save_load_model(path: Path, seed: int = 0, shape: Mapping[str, object] = TINY_LLAMA) -> Path:
    """Saves the seeded random model (of `shape`) with SmolLM2's tokenizer at `path`."""
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **shape,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
