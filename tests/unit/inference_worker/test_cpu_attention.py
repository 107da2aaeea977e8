"""Grouped-query SDPA on the CPU: a cached turn computes what transformers' default path
(K and V repeated per query head) computes, and loading a model on the CPU selects it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from inference_worker.cpu_attention import FORCE_GQA_VARIABLE
from inference_worker.model_store import load_model


def _cached_turn_logits(model: torch.nn.Module, history: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Logits of `new` [1, N] on a cache of `history` [1, H]: the masked path of a turn."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=history, cache=cache, use_cache=True)
        positions = torch.arange(history.shape[1], history.shape[1] + new.shape[1])[None]
        return model(input_ids=new, cache=cache, use_cache=True, position_ids=positions).logits


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_grouped_heads_give_the_logits_of_repeated_heads(
    tiny_model_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    monkeypatch.delenv(FORCE_GQA_VARIABLE, raising=False)
    model = load_model(tiny_model_dir(family), torch.float32, "cpu").model
    assert os.environ[FORCE_GQA_VARIABLE] == "1"  # selected by loading on the CPU
    assert model.config.num_attention_heads > model.config.num_key_value_heads  # a GQA model
    generator = torch.Generator().manual_seed(3)
    history = torch.randint(0, model.config.vocab_size, (1, 48), generator=generator)
    new = torch.randint(0, model.config.vocab_size, (1, 9), generator=generator)
    grouped = _cached_turn_logits(model, history, new)
    monkeypatch.setenv(FORCE_GQA_VARIABLE, "0")  # transformers' default: repeat_kv
    repeated = _cached_turn_logits(model, history, new)
    assert (grouped - repeated).abs().max().item() <= 1e-5


def test_an_explicit_setting_is_kept(
    tiny_model_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORCE_GQA_VARIABLE, "0")
    load_model(tiny_model_dir(), torch.float32, "cpu")
    assert os.environ[FORCE_GQA_VARIABLE] == "0"
