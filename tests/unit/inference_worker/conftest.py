"""Fixtures of the inference worker's unit tests: tiny random-weight models (seeded, fp32,
CPU) and helpers that stand in for the daemon's layer-major reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tiny_llama import TINY_LLAMA_SHAPE
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from attnstore.chunks.format import decode_layout
from attnstore.kvstore_client.results import LayerPiece

TINY_SHAPE: dict[str, Any] = {**TINY_LLAMA_SHAPE, "vocab_size": 256, "max_position_embeddings": 512}


def _build(model_class: type[PreTrainedModel], config: Any, attn_implementation: str) -> PreTrainedModel:
    torch.manual_seed(0)
    config._attn_implementation = attn_implementation
    return model_class(config).to(torch.float32).eval()


@pytest.fixture
def tiny_llama_factory() -> Callable[..., PreTrainedModel]:
    """Builds a tiny seeded LlamaForCausalLM; keyword arguments override its config
    (`attn_implementation` picks "sdpa" or "eager")."""

    def build(attn_implementation: str = "sdpa", **overrides: Any) -> PreTrainedModel:
        return _build(LlamaForCausalLM, LlamaConfig(**{**TINY_SHAPE, **overrides}), attn_implementation)

    return build


@pytest.fixture(scope="module")
def tiny_llama() -> PreTrainedModel:
    """A tiny seeded LlamaForCausalLM: 3 layers, 4 heads, 2 KV heads, head_dim 16, vocab 256."""
    return _build(LlamaForCausalLM, LlamaConfig(**TINY_SHAPE), "sdpa")


@pytest.fixture
def tiny_mistral_factory() -> Callable[..., PreTrainedModel]:
    """Builds a tiny seeded MistralForCausalLM (sliding-window attention when asked)."""

    def build(attn_implementation: str = "sdpa", **overrides: Any) -> PreTrainedModel:
        return _build(MistralForCausalLM, MistralConfig(**{**TINY_SHAPE, **overrides}), attn_implementation)

    return build


@pytest.fixture
def tiny_qwen2_factory() -> Callable[..., PreTrainedModel]:
    """Builds a tiny seeded Qwen2ForCausalLM (biased q, k, v projections)."""

    def build(attn_implementation: str = "sdpa", **overrides: Any) -> PreTrainedModel:
        return _build(Qwen2ForCausalLM, Qwen2Config(**{**TINY_SHAPE, **overrides}), attn_implementation)

    return build


@pytest.fixture
def layer_major_pieces() -> Callable[[list[bytes]], list[list[LayerPiece]]]:
    """Splits serialized chunks into the LayerPieces a daemon read yields, grouped per
    layer: result[layer][chunk_index] (the client yields them in that layer-major order)."""

    def split(chunks: list[bytes]) -> list[list[LayerPiece]]:
        layouts = [decode_layout(chunk) for chunk in chunks]
        num_layers = layouts[0].header.num_layers
        pieces: list[list[LayerPiece]] = []
        for layer in range(num_layers):
            row = []
            for index, (chunk, layout) in enumerate(zip(chunks, layouts, strict=True)):
                start, end = layout.layer_span(layer, layer + 1)
                row.append(LayerPiece(chunk_index=index, layer=layer, data=chunk[start:end], layout=layout))
            pieces.append(row)
        return pieces

    return split
