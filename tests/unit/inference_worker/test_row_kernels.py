"""The C RMSNorm, RoPE and SiLU-mul (row_ops.c) against transformers' own ops: RoPE to the bit,
RMSNorm within a rounding of its sum (torch sums in another order), SiLU-mul within its e^x's
error, at 1, 16 and 600 rows, reading q and k (gate and up) as the fused projection leaves them
(strided rows); RoPE writing K and V into the paged pool as PagedKV.write does; a module span
joined with its keys re-positioned as rotary_shift does; the fallbacks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.activations import SiLUActivation
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from attnstore.c_build import CACHE_VARIABLE
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.row_kernels import UNAVAILABLE_VARIABLE, RowKernels, load_row_kernels
from inference_worker.model_geometry import ModelGeometry
from inference_worker.rotary_shift import rotate_into

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 576, 9, 3, 64, 1536  # SmolLM2-135M's


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


@pytest.mark.parametrize("rows", [1, 16, 600])  # 600 rows: past the kernel's parallel threshold
def test_silu_mul_matches_transformers(kernels: RowKernels, rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    gate, up = (torch.randn(rows, 2 * INTERMEDIATE, generator=generator) * 6).chunk(2, -1)
    want = SiLUActivation()(gate) * up
    got = kernels.silu_mul(gate, up)
    # vector_exp.h's e^x against torch's: relative ~1e-7 of the largest output
    assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())
    assert got.is_contiguous() and got.shape == (rows, INTERMEDIATE)


def test_bad_layouts_are_refused(kernels: RowKernels) -> None:
    with pytest.raises(ValueError, match="contiguous elements"):
        kernels.rms_norm(torch.randn(HIDDEN, 4).t(), torch.randn(HIDDEN), 1e-5)
    q, cos = torch.randn(2, HEADS, 5), torch.randn(2, 1, 5)
    with pytest.raises(ValueError, match="even head dimension"):
        kernels.rope(q, q[:, :KV_HEADS], cos, cos)
    q = torch.randn(2, HEAD_DIM, HEADS).transpose(1, 2)
    with pytest.raises(ValueError, match="contiguous heads"):
        kernels.rope(q, q, torch.randn(2, 1, HEAD_DIM), torch.randn(2, 1, HEAD_DIM))
    gate_up = torch.randn(2, 2 * INTERMEDIATE)
    with pytest.raises(ValueError, match="one row stride"):
        kernels.silu_mul(gate_up[:, :INTERMEDIATE], gate_up[:, :INTERMEDIATE].contiguous())
    with pytest.raises(ValueError, match="one row stride"):
        kernels.silu_mul(*gate_up.t().chunk(2, 0))


def test_forced_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNAVAILABLE_VARIABLE, "1")
    loaded, choice = load_row_kernels.__wrapped__()
    assert loaded is None and choice.kernel == "torch" and UNAVAILABLE_VARIABLE in choice.reason


def test_without_a_compiler_torchs_ops_stay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "kernels"))
    loaded, choice = load_row_kernels.__wrapped__()
    assert loaded is None and "no-such-compiler" in choice.reason and "RMSNorm" in choice.reason


@pytest.mark.parametrize("rows", [1, 16, 600])
def test_rope_into_pool_writes_what_paged_kv_writes(kernels: RowKernels, rows: int) -> None:
    """The rotated k and v land in the slots `PagedKV.write` puts them in, bit for bit, and
    q, k come back as `rope` gives them."""
    generator = torch.Generator().manual_seed(rows)
    fused = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator)
    q, k, v = fused.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=1)
    q, k, v = (
        q.view(rows, HEADS, HEAD_DIM),
        k.view(rows, KV_HEADS, HEAD_DIM),
        v.view(rows, KV_HEADS, HEAD_DIM),
    )
    cos, sin = torch.randn(2, rows, 1, HEAD_DIM, generator=generator)
    geometry = ModelGeometry(2, HEADS, KV_HEADS, HEAD_DIM, max_positions=2048, vocab_size=300)
    want, got = (PagedKV(geometry, 80, 16, torch.float32, torch.device("cpu")) for _ in range(2))
    for pool in (want.k, want.v, got.k, got.v):
        pool.zero_()  # allocated, not cleared
    slots = torch.randperm(80 * 16, generator=generator)[:rows]  # scattered, as block tables are
    want_q, want_k = kernels.rope(q, k, cos, sin)
    want.write(1, slots, want_k, v)
    got_q, got_k = kernels.rope_into_pool(q, k, v, cos, sin, got.k[1], got.v[1], slots)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(got.k, want.k) and torch.equal(got.v, want.v)


def test_rope_into_pool_refuses_a_slot_outside_the_pool_and_writes_nothing(kernels: RowKernels) -> None:
    q, k, cos = (
        torch.randn(2, HEADS, HEAD_DIM),
        torch.randn(2, KV_HEADS, HEAD_DIM),
        torch.randn(2, 1, HEAD_DIM),
    )
    pool = torch.zeros(2, KV_HEADS, 4, 16, HEAD_DIM)  # K and V of one layer: 64 slots
    with pytest.raises(ValueError, match="outside the pool"):
        kernels.rope_into_pool(q, k, k, cos, cos, pool[0], pool[1], torch.tensor([3, 64]))
    with pytest.raises(ValueError, match="outside the pool"):
        kernels.rope_into_pool(q, k, k, cos, cos, pool[0], pool[1], torch.tensor([-1, 3]))
    assert not pool.any()
    with pytest.raises(ValueError, match="fp32 pool"):
        kernels.rope_into_pool(
            q, k, k, cos, cos, pool[0].bfloat16(), pool[1].bfloat16(), torch.tensor([0, 1])
        )
    with pytest.raises(ValueError, match="slots must be int64"):
        kernels.rope_into_pool(q, k, k, cos, cos, pool[0], pool[1], torch.tensor([0, 1], dtype=torch.int32))


@pytest.mark.parametrize("tokens", [1, 330, 1400])  # 1,400 tokens x 3 heads: the parallel region
def test_join_span_copies_and_rotates_as_the_torch_ops_do(kernels: RowKernels, tokens: int) -> None:
    """A module span (a token slice of a read layer) into a joined layer's slice: v copied,
    k rotated as rotary_shift.rotate_into rotates it within a rounding (torch's addcmul_ fuses
    its multiply-add, the kernel rounds like apply_rotary_pos_emb) or copied, without a
    rotation; the joined layer's other slots untouched."""
    generator = torch.Generator().manual_seed(tokens)
    stored = torch.randn(2, KV_HEADS, tokens + 7, HEAD_DIM, generator=generator)  # K/V [kv_heads, tokens, D]
    k, v = stored[0, :, 5 : 5 + tokens], stored[1, :, 5 : 5 + tokens]
    cos, sin = shift_by(11)
    want_k = torch.empty(KV_HEADS, tokens, HEAD_DIM)
    rotate_into(want_k, k, cos, sin)
    rounding = 2 * torch.finfo(torch.float32).eps * float(k.abs().max())
    for rotation, keys in (((cos, sin), want_k), (None, k)):
        joined = torch.full((2, KV_HEADS, tokens + 9, HEAD_DIM), 7.0)
        kernels.join_span(k, v, joined[0, :, 4 : 4 + tokens], joined[1, :, 4 : 4 + tokens], rotation)
        assert float((joined[0, :, 4 : 4 + tokens] - keys).abs().max()) <= (rounding if rotation else 0.0)
        assert torch.equal(joined[1, :, 4 : 4 + tokens], v)
        assert bool((joined[:, :, :4] == 7.0).all()) and bool((joined[:, :, 4 + tokens :] == 7.0).all())


def test_join_span_refuses_what_it_cannot_copy(kernels: RowKernels) -> None:
    k = torch.randn(KV_HEADS, 4, HEAD_DIM)
    with pytest.raises(ValueError, match="one shape"):
        kernels.join_span(k, k, torch.empty(KV_HEADS, 5, HEAD_DIM), torch.empty(KV_HEADS, 4, HEAD_DIM), None)
    with pytest.raises(ValueError, match="fp32"):
        kernels.join_span(k, k.bfloat16(), torch.empty_like(k), torch.empty_like(k), None)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.join_span(
            k, k.transpose(1, 2).contiguous().transpose(1, 2), torch.empty_like(k), torch.empty_like(k), None
        )


def shift_by(delta: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [HEAD_DIM] of a rotation by `delta` positions (rope theta 10,000)."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    angles = torch.cat([inv_freq, inv_freq]) * delta
    return angles.cos(), angles.sin()
