"""oneDNN linear layers on the CPU: every nn.Linear switches, the weights (and their tying)
stay, and the model computes what torch's default kernel computes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from inference_worker.cpu_linear import OneDnnLinear
from inference_worker.model_store import load_model


def _linears(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_onednn_gives_the_logits_and_tokens_of_torchs_kernel(
    tiny_model_dir: Callable[..., Path], family: str
) -> None:
    model_dir = tiny_model_dir(family)
    onednn = load_model(model_dir, torch.float32, "cpu", cpu_linear="onednn").model
    default = load_model(model_dir, torch.float32, "cpu", cpu_linear="torch").model
    assert {type(m) for m in _linears(onednn)} == {OneDnnLinear}
    assert {type(m) for m in _linears(default)} == {nn.Linear}

    ids = torch.randint(0, onednn.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, expected = onednn(input_ids=ids).logits, default(input_ids=ids).logits  # [1, 40, vocab]
        tokens = onednn.generate(ids, max_new_tokens=16, do_sample=False)[0, 40:]
        expected_tokens = default.generate(ids, max_new_tokens=16, do_sample=False)[0, 40:]
    assert (got - expected).abs().max().item() <= 1e-4
    assert tokens.tolist() == expected_tokens.tolist()


def test_tied_weights_stay_tied_and_bf16_runs(tiny_model_dir: Callable[..., Path]) -> None:
    loaded = load_model(tiny_model_dir(tie_word_embeddings=True), torch.bfloat16, "cpu")
    model = loaded.model
    assert type(model.lm_head) is OneDnnLinear
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits  # [1, 3, vocab]
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
