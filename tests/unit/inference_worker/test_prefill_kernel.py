"""The C prefill-attention kernel over block tables against torch's SDPA with each chunk's
causal mask over its gathered context: several chunks in one call, with and without earlier
KV, scattered tables, lengths around its tiles (48 query rows: 48 / group tokens) and key
chunks (32), grouped heads whose tile rows do not fill three vectors, head sizes off its
eight-column steps; the other rows untouched; the machine's build and a -mno-avx512f one.
`spans`: one sequence's rows over keys in separate runs (strided, some to be re-positioned by
a rotation the kernel applies to the queries instead) and their own K and V, against SDPA
over the keys rotated and concatenated, around tiles, key chunks and split parts; the same
answer as the block-table call over the same keys."""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from attnstore.c_build import build_library
from inference_worker.engine.prefill_kernel import (
    SOURCE,
    UNAVAILABLE_VARIABLE,
    KeySpan,
    PagedPrefillKernel,
    PrefillTables,
    load_paged_prefill,
)
from inference_worker.rotary_shift import rotate_half

BLOCKS, BLOCK_TOKENS = 90, 8
TOLERANCE = 1e-5


# The kernel as this machine builds it, and as a CPU without AVX-512 runs it (its plain
# loops): every machine tests both.
@pytest.fixture(scope="module", params=["native", "without-avx512"])
def kernel(request: pytest.FixtureRequest) -> PagedPrefillKernel:
    if request.param == "without-avx512":
        return PagedPrefillKernel(ctypes.CDLL(str(build_library(SOURCE, ("-mno-avx512f",)))))
    loaded, choice = load_paged_prefill()
    assert loaded is not None, choice.reason  # the development machines have a C compiler
    return loaded


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: list[int], start: int
) -> torch.Tensor:
    """q [new, heads, D] at positions start.. over the first start + new tokens of `table`,
    causally: [new, heads, D]."""
    kv_heads, _, _, dim = k.shape
    context = start + q.shape[0]
    keys = k[:, table].reshape(kv_heads, -1, dim)[:, :context]
    values = v[:, table].reshape(kv_heads, -1, dim)[:, :context]
    allowed = torch.arange(context)[None, :] <= torch.arange(start, context)[:, None]
    return F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys[None], values[None], attn_mask=allowed, scale=0.3, enable_gqa=True
    )[0].transpose(0, 1)


# (3, 1, 16): 16-token tiles; (9, 3, 64): SmolLM2's; (7, 1, 20): 6-token tiles, 42 of 48 rows,
# head_dim off the 8-column steps; (16, 2, 128): 6-token tiles; (16, 1, 16): 3-token tiles;
# (2, 2, 24): one head a group, 48-token tiles.
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(3, 1, 16), (9, 3, 64), (7, 1, 20), (16, 2, 128), (16, 1, 16), (2, 2, 24)],
)
def test_kernel_matches_sdpa_over_the_gathered_context(
    kernel: PagedPrefillKernel, heads: int, kv_heads: int, dim: int
) -> None:
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    k = torch.randn(kv_heads, BLOCKS, BLOCK_TOKENS, dim, generator=generator)
    v = torch.randn(kv_heads, BLOCKS, BLOCK_TOKENS, dim, generator=generator)
    # (start, new): fresh prompts, chunks after earlier KV, around the 16-token tiles and 32-key chunks
    shapes = [(0, 2), (0, 37), (5, 1), (31, 17), (64, 48), (100, 130), (7, 3)]
    order = torch.randperm(BLOCKS, generator=generator).tolist()
    tables = [[order.pop() for _ in range(-(-(s + n) // BLOCK_TOKENS))] for s, n in shapes]
    tokens = sum(n for _, n in shapes) + 4  # 4 rows no chunk owns
    q = torch.randn(tokens, heads, dim, generator=generator)
    firsts, row = [], 2
    for _, n in shapes:
        firsts.append(row)
        row += n
    out = torch.full_like(q, 7.0)
    chunks = [(f, n, s, t) for f, (s, n), t in zip(firsts, shapes, tables, strict=True)]
    kernel(q, k, v, out, PrefillTables.of(chunks, q.device), scale=0.3)
    owned = torch.zeros(tokens, dtype=torch.bool)
    for first, (start, new), table in zip(firsts, shapes, tables, strict=True):
        want = reference(q[first : first + new], k, v, table, start)
        assert (out[first : first + new] - want).abs().max().item() <= TOLERANCE
        owned[first : first + new] = True
    assert bool((out[~owned] == 7.0).all())


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("start", "new"), [(600, 1), (600, 9), (511, 20), (300, 40), (700, 16)])
def test_a_short_chunk_after_a_long_prefix_splits_its_keys(
    kernel: PagedPrefillKernel, threads: int, start: int, new: int
) -> None:
    """Few tasks for the threads: each task's earlier keys are split into parts of at least 256
    keys, computed apart and merged; the same answer as SDPA."""
    generator = torch.Generator().manual_seed(start + new)
    heads, kv_heads, dim = 9, 3, 64
    k = torch.randn(kv_heads, BLOCKS, BLOCK_TOKENS, dim, generator=generator)
    v = torch.randn(kv_heads, BLOCKS, BLOCK_TOKENS, dim, generator=generator)
    table = torch.randperm(BLOCKS, generator=generator)[: -(-(start + new) // BLOCK_TOKENS)].tolist()
    q = torch.randn(new, heads, dim, generator=generator)
    out = torch.zeros_like(q)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernel(q, k, v, out, PrefillTables.of([(0, new, start, table)], q.device), scale=0.3)
    finally:
        torch.set_num_threads(previous)
    assert (out - reference(q, k, v, table, start)).abs().max().item() <= TOLERANCE


def rotation(delta: float, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [dim] of RoPE's rotation by `delta` positions (base 10,000)."""
    angles = delta / 10_000 ** (torch.arange(0, dim, 2) / dim)
    return angles.cos().repeat(2), angles.sin().repeat(2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("lengths", "new"),
    [([3, 330, 341, 322], 14), ([3, 330, 341, 322], 19), ([700], 32), ([31, 33, 5], 1), ([600, 20], 40)],
)
def test_spans_match_sdpa_over_the_keys_rotated_and_joined(
    kernel: PagedPrefillKernel, threads: int, lengths: list[int], new: int
) -> None:
    """A module prompt's layer: spans cut out of longer tensors (head and token strides of
    their own), every other one served `delta` positions away from where it was encoded, then
    the rows' own K and V as the runner holds them (rows of [tokens, kv_heads, D])."""
    generator = torch.Generator().manual_seed(sum(lengths) + new)
    heads, kv_heads, dim = 9, 3, 64
    spans: list[KeySpan] = []
    keys, values = [], []
    for index, length in enumerate(lengths):
        k, v = (torch.randn(kv_heads, length + 9, dim, generator=generator)[:, 4 : 4 + length] for _ in "kv")
        turn = rotation(37.0 * index, dim) if index % 2 else None
        spans.append((k, v, turn))
        keys.append(k if turn is None else k * turn[0] + rotate_half(k) * turn[1])
        values.append(v)
    own = torch.randn(new, 2 * kv_heads, dim, generator=generator)  # K, then V heads: strided rows
    spans.append((own[:, :kv_heads].transpose(0, 1), own[:, kv_heads:].transpose(0, 1), None))
    keys.append(own[:, :kv_heads].transpose(0, 1))
    values.append(own[:, kv_heads:].transpose(0, 1))
    q = torch.randn(new + 2, heads, dim, generator=generator)  # rows 1.. of 2 more: the rest untouched
    out = torch.zeros_like(q)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernel.spans(q, out, slice(1, 1 + new), spans, scale=0.3)
    finally:
        torch.set_num_threads(previous)
    context, start = torch.cat(keys, 1), sum(lengths)
    allowed = torch.arange(start + new)[None, :] <= torch.arange(start, start + new)[:, None]
    want = F.scaled_dot_product_attention(
        q[1 : 1 + new].transpose(0, 1)[None], context[None], torch.cat(values, 1)[None], attn_mask=allowed,
        scale=0.3, enable_gqa=True,
    )[0].transpose(0, 1)  # fmt: skip
    assert (out[1 : 1 + new] - want).abs().max().item() <= TOLERANCE
    assert not out[0].any() and not out[-1].any()


def test_spans_refuse_what_they_cannot_attend(kernel: PagedPrefillKernel) -> None:
    q, own = torch.randn(2, 2, 8), torch.zeros(1, 2, 8)  # 2 rows; their own K and V: 2 tokens
    strided, wide = torch.zeros(1, 8, 2).transpose(1, 2), torch.zeros(2, 4, 8)
    cases = [
        (q, [(own.bfloat16(), own.bfloat16(), None)], "float32"),
        (q, [(strided, strided, None)], "contiguous"),
        (q.transpose(0, 1), [(own, own, None)], "contiguous"),
        (q, [(own, own, None), (torch.zeros(1, 4, 8),) * 2 + (None,)], "own K and V: 2 tokens"),
        (q, [(wide, wide, None), (own, own, None)], "of the rows' heads"),
    ]
    for rows, spans, message in cases:
        with pytest.raises(ValueError, match=message):
            kernel.spans(rows, torch.empty(2, 2, 8), slice(0, 2), spans, scale=1.0)


def test_kernel_refuses_strided_tensors(kernel: PagedPrefillKernel) -> None:
    q = torch.randn(4, 2, 8).transpose(0, 1)  # not contiguous
    k = torch.zeros(1, 2, BLOCK_TOKENS, 8)
    chunks = PrefillTables.of([(0, 2, 0, [0])], torch.device("cpu"))
    with pytest.raises(ValueError, match="contiguous"):
        kernel(q, k, k, torch.empty(2, 4, 8), chunks, scale=1.0)


def test_kernel_refuses_other_dtypes(kernel: PagedPrefillKernel) -> None:
    q, k = (
        torch.randn(2, 2, 8, dtype=torch.bfloat16),
        torch.zeros(1, 2, BLOCK_TOKENS, 8, dtype=torch.bfloat16),
    )
    chunks = PrefillTables.of([(0, 2, 0, [0])], torch.device("cpu"))
    with pytest.raises(ValueError, match="float32"):
        kernel(q, k, k, torch.empty_like(q), chunks, scale=1.0)
    assert not PagedPrefillKernel.supports(torch.bfloat16, torch.device("cpu"))


def test_kernel_refuses_heads_that_do_not_group(kernel: PagedPrefillKernel) -> None:
    q, k = torch.randn(2, 5, 8), torch.zeros(2, 2, BLOCK_TOKENS, 8)
    chunks = PrefillTables.of([(0, 2, 0, [0])], torch.device("cpu"))
    with pytest.raises(RuntimeError, match="do not group"):
        kernel(q, k, k, torch.empty_like(q), chunks, scale=1.0)


def test_forced_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNAVAILABLE_VARIABLE, "1")
    loaded, choice = load_paged_prefill.__wrapped__()
    assert loaded is None and choice.kernel == "torch" and UNAVAILABLE_VARIABLE in choice.reason
