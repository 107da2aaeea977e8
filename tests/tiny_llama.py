"""The tiny Llama the worker's tests compute with, written once: unit tests build it in memory
(unit/inference_worker/conftest.py, other families too), integration tests save it with the
tiny tokenizer (integration/inference_worker/conftest.py). Each adds its vocabulary and
context length."""

from __future__ import annotations

from typing import Any

TINY_LLAMA_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # GQA, as in the real models
    # Larger than the default 0.02: peaked logits, so greedy tokens never hinge on a near tie.
    "initializer_range": 0.2,
}
