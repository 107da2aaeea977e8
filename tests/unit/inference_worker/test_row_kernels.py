"""The C RMSNorm and RoPE (row_ops.c) against transformers' own ops: RoPE to the bit, RMSNorm
within a rounding of its sum (torch sums in another order), at 1, 16 and 600 rows, reading
q and k as the fused projection leaves them (strided rows); the fallbacks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from inference_worker.engine.c_build import CACHE_VARIABLE
from inference_worker.engine.row_kernels import UNAVAILABLE_VARIABLE, RowKernels, load_row_kernels

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 576, 9, 3, 64  # SmolLM2-135M's


@pytest.fixture(scope="module")
def kernels() -> RowKernels:
    loaded, choice = load_row_kernels()
    assert loaded is not None, choice.reason  # a machine without a compiler must not pass for one with it
    return loaded


@pytest.mark.parametrize("rows", [1, 16, 600])
def test_rms_norm_matches_transformers(kernels: RowKernels, rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    norm = LlamaRMSNorm(HIDDEN, eps=1e-5)
    norm.weight.data = torch.randn(HIDDEN, generator=generator)
    x = torch.randn(rows, 2 * HIDDEN, generator=generator)[:, :HIDDEN] * 3  # strided rows
    with torch.no_grad():
        want = norm(x)
    got = kernels.rms_norm(x, norm.weight.detach(), 1e-5)
    # one rounding of the sum of squares apart: relative 1e-6 of the largest output
    assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())


@pytest.mark.parametrize("rows", [1, 16, 600])
def test_rope_matches_transformers_exactly(kernels: RowKernels, rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    fused = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator)
    q = fused[:, : HEADS * HEAD_DIM].view(rows, HEADS, HEAD_DIM)
    k = fused[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(rows, KV_HEADS, HEAD_DIM)
    cos, sin = torch.randn(2, rows, 1, HEAD_DIM, generator=generator)
    got_q, got_k = kernels.rope(q, k, cos, sin)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos[:, 0], sin[:, 0], unsqueeze_dim=1)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert got_q.is_contiguous() and got_k.is_contiguous()


def test_bad_layouts_are_refused(kernels: RowKernels) -> None:
    with pytest.raises(ValueError, match="contiguous elements"):
        kernels.rms_norm(torch.randn(HIDDEN, 4).t(), torch.randn(HIDDEN), 1e-5)
    q, cos = torch.randn(2, HEADS, 5), torch.randn(2, 1, 5)
    with pytest.raises(ValueError, match="even head dimension"):
        kernels.rope(q, q[:, :KV_HEADS], cos, cos)
    q = torch.randn(2, HEAD_DIM, HEADS).transpose(1, 2)
    with pytest.raises(ValueError, match="contiguous heads"):
        kernels.rope(q, q, torch.randn(2, 1, HEAD_DIM), torch.randn(2, 1, HEAD_DIM))


def test_forced_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNAVAILABLE_VARIABLE, "1")
    loaded, choice = load_row_kernels.__wrapped__()
    assert loaded is None and choice.kernel == "torch" and UNAVAILABLE_VARIABLE in choice.reason


def test_without_a_compiler_torchs_ops_stay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "kernels"))
    loaded, choice = load_row_kernels.__wrapped__()
    assert loaded is None and "no-such-compiler" in choice.reason and "RMSNorm" in choice.reason
