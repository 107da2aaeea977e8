"""The C decode-attention kernel (and the GPU's batched torch one) over block tables against torch's SDPA over the same
context: scattered and padded tables, ragged lengths (block boundaries, lengths under and
over its four-token steps), block sizes a power of two (a shift) and not (a division), grouped heads, sliding windows, fp32 and bf16, decode rows in
any order with the other rows untouched, each (group, head_dim) copy the kernel specializes
and the generic one; and the fallback when it cannot be built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from c_builds import C_BUILDS, built_kernel

from attnstore.c_build import CACHE_VARIABLE
from inference_worker.engine.attention import DecodeTables
from inference_worker.engine.decode_batched import BatchedDecode
from inference_worker.engine.decode_kernel import (
    SOURCE,
    UNAVAILABLE_VARIABLE,
    DecodeAttention,
    PagedDecodeKernel,
    load_paged_decode,
)

BLOCKS, BLOCK_TOKENS = 40, 4


# the portable loops instead of the 16-key scores too, and the GPU's batched torch calls (on
# the CPU here: the same ops)
@pytest.fixture(scope="module", params=[*C_BUILDS, "torch-batched"])
def kernel(request: pytest.FixtureRequest) -> DecodeAttention:
    if request.param == "torch-batched":
        return BatchedDecode()
    return built_kernel(request.param, SOURCE, PagedDecodeKernel, load_paged_decode)


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: list[int], n: int, window: int | None
) -> torch.Tensor:
    """q [heads, D] over the first n tokens of `table` (the last `window` of them): [heads, D]."""
    kv_heads, _, _, dim = k.shape
    keys = k[:, table].reshape(kv_heads, -1, dim)[:, :n].float()
    values = v[:, table].reshape(kv_heads, -1, dim)[:, :n].float()
    first = max(0, n - window) if window else 0
    return F.scaled_dot_product_attention(
        q.float()[None, :, None], keys[None, :, first:], values[None, :, first:], scale=0.3, enable_gqa=True
    )[0, :, 0]


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("block_tokens", [BLOCK_TOKENS, 6])
# dim 16 and (group 3, 128): the generic copy; the others: paged_decode.c's SPECIALIZED_TASKS.
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [
        (6, 2, 16),
        (4, 4, 16),
        (3, 1, 16),
        (9, 3, 64),
        (2, 2, 64),
        (14, 2, 64),
        (12, 2, 128),
        (8, 2, 128),
        (6, 2, 128),
    ],
)
def test_kernel_matches_sdpa_over_the_gathered_context(
    kernel: DecodeAttention,
    dtype: torch.dtype,
    tolerance: float,
    window: int | None,
    block_tokens: int,
    heads: int,
    kv_heads: int,
    dim: int,
) -> None:
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    k = torch.randn(kv_heads, BLOCKS, block_tokens, dim, generator=generator).to(dtype)
    v = torch.randn(kv_heads, BLOCKS, block_tokens, dim, generator=generator).to(dtype)
    lengths = [1, 3, 4, 5, 8, 13, 22, 37]
    order = torch.randperm(BLOCKS, generator=generator).tolist()
    tables = [[order.pop() for _ in range(-(-n // block_tokens))] for n in lengths]
    q = torch.randn(len(lengths) + 3, heads, dim, generator=generator).to(dtype)  # 3 rows not decoded
    rows = torch.randperm(q.shape[0], generator=generator)[: len(lengths)].tolist()
    out = torch.full_like(q, 7.0)
    decode = DecodeTables.of(list(zip(rows, tables, lengths, strict=True)), torch.device("cpu"))
    kernel(q, k, v, out, decode.rows, decode.tables, decode.lens, scale=0.3, window=window)
    for row, table, n in zip(rows, tables, lengths, strict=True):
        want = reference(q[row], k, v, table, n, window)
        assert (out[row].float() - want).abs().max().item() <= tolerance
    untouched = sorted(set(range(q.shape[0])) - set(rows))
    assert bool((out[untouched] == 7.0).all())


def test_kernel_refuses_strided_tensors(kernel: DecodeAttention) -> None:
    q = torch.randn(4, 2, 8).transpose(0, 1)  # not contiguous
    k = v = torch.zeros(1, 2, BLOCK_TOKENS, 8)
    decode = DecodeTables.of([(0, [0], 1)], torch.device("cpu"))
    with pytest.raises(ValueError, match="contiguous"):
        kernel(q, k, v, torch.empty(2, 4, 8), decode.rows, decode.tables, decode.lens, scale=1.0, window=None)


def test_kernel_refuses_heads_that_do_not_group(kernel: DecodeAttention) -> None:
    q, k = torch.randn(1, 5, 8), torch.zeros(2, 2, BLOCK_TOKENS, 8)
    decode = DecodeTables.of([(0, [0], 1)], torch.device("cpu"))
    with pytest.raises(RuntimeError, match="unsupported heads"):
        kernel(q, k, k, torch.empty_like(q), decode.rows, decode.tables, decode.lens, scale=1.0, window=None)


def test_without_a_compiler_the_engine_keeps_torchs_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "kernels"))
    loaded, choice = load_paged_decode.__wrapped__()
    assert loaded is None
    assert choice.kernel == "torch" and "no-such-compiler" in choice.reason and "SDPA" in choice.reason


def test_a_source_that_does_not_compile_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "paged_decode.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr("inference_worker.engine.decode_kernel.SOURCE", broken)
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "kernels"))
    loaded, choice = load_paged_decode.__wrapped__()
    assert loaded is None and "failed" in choice.reason
    assert not list((tmp_path / "kernels").glob("*.so"))


def test_forced_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNAVAILABLE_VARIABLE, "1")
    loaded, choice = load_paged_decode.__wrapped__()
    assert loaded is None and UNAVAILABLE_VARIABLE in choice.reason


def test_the_build_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path))
    first, _ = load_paged_decode.__wrapped__()
    built = list(tmp_path.glob("paged_decode-*.so"))
    assert first is not None and len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    second, _ = load_paged_decode.__wrapped__()
    assert second is not None and built[0].stat().st_mtime_ns == stamp
