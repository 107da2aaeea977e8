"""Boundary repair's layout with any set of repaired tokens per piece: the rest of each piece
is loaded in runs, the repaired tokens are computed by position, bad indices are refused;
the first-token method is the same set written as indices; and the deviation selection on a
tiny random model keeps the budget and never picks the first module."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from inference_worker.modules.module_kv import ModuleKV
from inference_worker.modules.module_prompt import (
    CachedPiece,
    ModuleLayoutError,
    ModulePrompt,
    TextPart,
    lay_out,
)
from inference_worker.modules.repair_selection import select_by_deviation


def module(tokens: list[int], base: int, layers: int = 1, kv_heads: int = 1, dim: int = 4) -> ModuleKV:
    kv = [(torch.randn(kv_heads, len(tokens), dim), torch.randn(kv_heads, len(tokens), dim))] * layers
    return ModuleKV(tuple(tokens), tuple(range(base, base + len(tokens))), kv)


def two_pieces(repaired: tuple[tuple[int, ...], ...] | None, repair_tokens: int = 0) -> ModulePrompt:
    a, b = module([10, 11, 12], 0), module([20, 21, 22, 23, 24], 3)
    text = TextPart((30, 31), (8, 9))
    return ModulePrompt((CachedPiece.whole(a, 0), CachedPiece.whole(b, 3)), (text,), repair_tokens, repaired)


def test_any_repaired_set_is_computed_and_the_rest_loaded_in_runs() -> None:
    layout = lay_out(two_pieces(((), (1, 3))))
    assert [(s.part.module.token_ids[0], s.start, s.stop) for s in layout.spans] == [
        (10, 0, 3),
        (20, 0, 1),
        (20, 2, 3),
        (20, 4, 5),
    ]
    assert layout.token_ids == [10, 11, 12, 20, 22, 24, 21, 23, 30, 31]
    assert layout.positions == [0, 1, 2, 3, 5, 7, 4, 6, 8, 9]
    assert layout.repaired_tokens == 2 and layout.cached_tokens == 6


def test_first_tokens_are_the_same_set_as_indices() -> None:
    by_count = two_pieces(None, repair_tokens=2)
    assert by_count.repair_indices() == ((), (0, 1))
    mine, theirs = lay_out(by_count), lay_out(two_pieces(((), (0, 1))))
    assert (mine.token_ids, mine.positions) == (theirs.token_ids, theirs.positions)
    assert (
        [(s.start, s.stop) for s in mine.spans]
        == [(s.start, s.stop) for s in theirs.spans]
        == [(0, 3), (2, 5)]
    )


def test_the_last_token_of_a_run_is_computed_when_the_prompt_ends_there() -> None:
    a, b = module([10, 11, 12], 0), module([20, 21, 22], 3)
    prompt = ModulePrompt((CachedPiece.whole(a, 0), CachedPiece.whole(b, 3)), (), repaired=((), (0,)))
    layout = lay_out(prompt)
    assert layout.positions[-2:] == [3, 5] and layout.token_ids[-1] == 22  # 22 ends the prompt


@pytest.mark.parametrize("repaired", [((), (5,)), ((), (-1,)), ((),)])
def test_bad_repaired_sets_are_refused(repaired: tuple[tuple[int, ...], ...]) -> None:
    with pytest.raises(ModuleLayoutError):
        lay_out(two_pieces(repaired))


def test_deviation_keeps_the_budget_and_skips_the_first_module(
    tiny_model_dir: Callable[..., Path],
) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir(num_hidden_layers=4), dtype=torch.float32
    ).eval()
    config = model.config
    kv_heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    layers = config.num_hidden_layers
    a = module([5, 6, 7, 8], 0, layers, kv_heads, dim)
    b = module([9, 10, 11, 12, 13, 14], 4, layers, kv_heads, dim)
    prompt = ModulePrompt((CachedPiece.whole(a, 0), CachedPiece.whole(b, 4)), (), repair_tokens=3)
    chosen = select_by_deviation(prompt, model).repair_indices()
    assert chosen[0] == () and len(chosen[1]) == 3
    assert select_by_deviation(prompt, model, budget=100).repair_indices() == ((), tuple(range(6)))
    with pytest.raises(ValueError, match="deviation layer"):
        select_by_deviation(prompt, model, layer=layers)
