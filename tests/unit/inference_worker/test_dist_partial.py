"""The DistAttention operators: any split of a sequence's KV into parts (contiguous or
not, in any order) gives, after the merge, monolithic attention's output within 1e-4
(fp32), in prefill (causal by absolute positions, sliding window) and decode, with grouped
query heads; a part a query cannot see weighs nothing."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_worker.dist_attention.partial import (
    Partial,
    merge,
    merge_stacked,
    merge_two,
    partial_attention,
)
from inference_worker.dist_attention.segment import LocalSegment, RecalledSegment

TOLERANCE = 1e-4


def monolithic(q, k, v, q_pos, k_pos, scale, window):
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=allowed,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)  # [Q, H, D]


def random_qkv(
    seed: int, queries: int, heads: int, tokens: int, kv_heads: int, dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded q [queries, heads, dim] and k, v [tokens, kv_heads, dim], drawn in that order."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(queries, heads, dim, generator=gen)
    k = torch.randn(tokens, kv_heads, dim, generator=gen)
    return q, k, torch.randn(tokens, kv_heads, dim, generator=gen)


@st.composite
def split_case(draw: st.DrawFn) -> dict:
    kv_heads = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2, 3]))
    context = draw(st.integers(1, 96))
    queries = draw(st.integers(1, min(context, 12)))  # the last `queries` positions
    window = draw(st.one_of(st.none(), st.integers(1, 64)))
    cuts = sorted(draw(st.lists(st.integers(1, max(1, context - 1)), max_size=6, unique=True)))
    shuffle = draw(st.booleans())  # parts as non-contiguous position sets
    seed = draw(st.integers(0, 2**16))
    return {"kv_heads": kv_heads, "group": group, "context": context, "queries": queries, "window": window,
                "cuts": [c for c in cuts if c < context], "shuffle": shuffle, "seed": seed}  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(split_case())
def test_any_split_merges_to_monolithic_attention(case: dict) -> None:
    gen = torch.Generator().manual_seed(case["seed"])
    heads, dim, n = case["kv_heads"] * case["group"], 16, case["context"]
    q = torch.randn(case["queries"], heads, dim, generator=gen)
    k = torch.randn(n, case["kv_heads"], dim, generator=gen) * 3  # peaked scores: stability matters
    v = torch.randn(n, case["kv_heads"], dim, generator=gen)
    k_pos = torch.arange(n)
    q_pos = torch.arange(n - case["queries"], n)
    order = torch.randperm(n, generator=gen) if case["shuffle"] else torch.arange(n)
    scale = 1 / math.sqrt(dim)
    parts = [
        partial_attention(q, k[idx], v[idx], q_pos, k_pos[idx], scale=scale, window=case["window"])
        for idx in torch.tensor_split(order, case["cuts"])
    ]
    expected = monolithic(q, k, v, q_pos, k_pos, scale, case["window"])
    assert (merge(parts).out - expected).abs().max() <= TOLERANCE
    assert (merge(parts[::-1]).out - expected).abs().max() <= TOLERANCE


def test_lse_is_the_log_sum_exp_of_scaled_scores_and_minus_inf_where_nothing_is_visible() -> None:
    q, k, v = random_qkv(1, queries=3, heads=4, tokens=5, kv_heads=2, dim=8)
    part = partial_attention(q, k, v, torch.tensor([1, 10, 11]), torch.arange(5, 10), scale=0.5)
    scores = torch.einsum("qhd,thd->qht", q, k.repeat_interleave(2, dim=1)) * 0.5
    assert torch.isneginf(part.lse[0]).all()  # position 1 sees none of positions 5..9
    assert (part.lse[1:] - torch.logsumexp(scores[1:], dim=-1)).abs().max() <= TOLERANCE
    merged = merge(
        [part, partial_attention(q, k[:0], v[:0], torch.tensor([1, 10, 11]), torch.arange(0), scale=0.5)]
    )
    assert torch.equal(merged.out[1:], part.out[1:]) and torch.isneginf(merged.lse[0]).all()


def test_shapes_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="shapes do not fit"):
        partial_attention(torch.zeros(1, 3, 8), torch.zeros(2, 2, 8), torch.zeros(2, 2, 8),
                          torch.tensor([2]), torch.arange(2), scale=1.0)  # fmt: skip


@pytest.mark.parametrize("layout", ["rows", "chunk"])
def test_two_part_merge_is_the_stacked_merge_with_minus_inf_rows(layout: str) -> None:
    """merge_two (no stacked copy) against merge_stacked: rows only one part sees, rows
    neither sees (0 and -inf, never NaN), and a prefill chunk's [1, H, Q, D] layout."""
    gen = torch.Generator().manual_seed(7)
    shape = (5, 3) if layout == "rows" else (1, 3, 5)
    outs = [torch.randn(*shape, 8, generator=gen) for _ in range(2)]
    lses = [torch.randn(*shape, generator=gen) * 4 for _ in range(2)]
    first_blind, second_blind = torch.zeros(shape, dtype=torch.bool), torch.zeros(shape, dtype=torch.bool)
    first_blind.view(-1)[[0, 3, 7]] = True
    second_blind.view(-1)[[3, 7, 9, 11]] = True  # 3 and 7: neither part sees a key
    lses[0] = lses[0].masked_fill(first_blind, float("-inf"))
    lses[1] = lses[1].masked_fill(second_blind, float("-inf"))
    got = merge_two(Partial(outs[0], lses[0]), Partial(outs[1], lses[1]))
    want = merge_stacked(torch.stack(outs), torch.stack(lses))
    assert not got.out.isnan().any() and not got.lse.isnan().any()
    torch.testing.assert_close(got.out, want.out, atol=1e-6, rtol=0)
    torch.testing.assert_close(got.lse, want.lse, atol=1e-6, rtol=0)
    neither = first_blind & second_blind
    assert torch.isneginf(got.lse[neither]).all() and (got.out[neither] == 0).all()
    assert torch.equal(got.out[first_blind & ~neither], outs[1][first_blind & ~neither])


def test_two_part_merge_told_every_row_is_seen_is_the_checked_merge() -> None:
    """every_row_seen (chunk_attention's causal own part) skips only the unseen-row test:
    with rows one part does not see, the result is bitwise the checked merge's."""
    gen = torch.Generator().manual_seed(11)
    outs = [torch.randn(1, 3, 5, 8, generator=gen) for _ in range(2)]
    lses = [torch.randn(1, 3, 5, generator=gen) * 4 for _ in range(2)]
    lses[1][0, :, 0] = float("-inf")  # the earlier part unseen by a row, as a window would
    checked = merge_two(Partial(outs[0], lses[0]), Partial(outs[1], lses[1]))
    trusted = merge_two(Partial(outs[0], lses[0]), Partial(outs[1], lses[1]), every_row_seen=True)
    assert torch.equal(trusted.out, checked.out) and torch.equal(trusted.lse, checked.lse)
    assert torch.equal(trusted.out[0, :, 0], outs[0][0, :, 0])


def test_merge_is_stable_with_huge_scores() -> None:
    """lse of 1e4 in one part and -1e4 in another: no overflow, the big part wins."""
    out_a, out_b = torch.ones(1, 1, 2), torch.zeros(1, 1, 2)
    merged = merge([Partial(out_a, torch.tensor([[1e4]])), Partial(out_b, torch.tensor([[-1e4]]))])
    assert torch.equal(merged.out, out_a) and merged.lse.item() == pytest.approx(1e4)


@pytest.mark.gpu
def test_cuda_partials_match_cpu() -> None:
    q, k, v = random_qkv(2, queries=4, heads=6, tokens=300, kv_heads=2, dim=32)
    q_pos, k_pos = torch.arange(296, 300), torch.arange(300)
    parts = [partial_attention(q.cuda(), k[s].cuda(), v[s].cuda(), q_pos.cuda(), k_pos[s].cuda(), scale=0.2, window=100)
             for s in (slice(0, 150), slice(150, 300))]  # fmt: skip
    expected = monolithic(q, k, v, q_pos, k_pos, 0.2, 100)
    assert (merge(parts).out.cpu() - expected).abs().max() <= TOLERANCE


def recalled_and_local(device: str) -> tuple[Partial, Partial]:
    """The partial of a recalled segment (KV in host memory, as HeldKV keeps it) for queries
    on `device`, and the same segment's partial computed on the host."""
    q, k, v = random_qkv(3, queries=4, heads=6, tokens=40, kv_heads=2, dim=32)
    local = LocalSegment(
        1, 2, 32, start=100, capacity_tokens=40, dtype=torch.float32, device=torch.device("cpu")
    )
    local.append(k[None], v[None])
    released: list[bool] = []
    recalled = RecalledSegment(local, lambda: released.append(True))
    positions = torch.arange(136, 140)
    got = recalled.partial(0, q.to(device), positions.to(device), scale=0.2, window=None)
    recalled.release()
    assert released == [True] and got.out.device.type == device
    return got, local.partial(0, q, positions, scale=0.2, window=None)


def test_a_recalled_segment_attends_like_a_local_one() -> None:
    got, expected = recalled_and_local("cpu")
    assert torch.equal(got.out, expected.out) and torch.equal(got.lse, expected.lse)


@pytest.mark.gpu
def test_a_recalled_segment_answers_cuda_queries_on_the_gpu() -> None:
    got, expected = recalled_and_local("cuda")
    assert (got.out.cpu() - expected.out).abs().max() <= TOLERANCE
    assert (got.lse.cpu() - expected.lse).abs().max() <= TOLERANCE
