"""Partial attention over any subset of a sequence's KV, and the exact merge of partials.

A partial is (out, lse): the attention output of the queries over one part's keys,
normalised within that part, and the log-sum-exp of the part's scaled scores per query and
head. Softmax over the union of parts is then exactly
    out = sum_i exp(lse_i - lse) * out_i,   lse = logsumexp_i(lse_i)
(FlashAttention's rescaling, done once per part instead of once per tile). A query that
sees no key of a part (causal or window mask) has lse = -inf there and weighs nothing.

Decisions:
- Masks come from absolute positions (query positions vs key positions), so a part needs
  no knowledge of where it sits in the sequence, and parts may even interleave.
- Grouped-query attention without repeating KV heads: the G query heads of one KV head
  become Q*G rows of that head (SDPA's batch of heads = KV heads), the mask repeated per
  row block. Exact, and K/V are read once.
- On a CPU, torch's flash kernel (`_scaled_dot_product_flash_attention_for_cpu`) returns the
  log-sum-exp with the output: the same kernel as monolithic SDPA, so a split costs only
  the merge (bench-longctx measures it). It reports lse = 0 for a row with no visible key,
  which is set to -inf here. Elsewhere (CUDA), one fp32 matmul-softmax-matmul per part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Partial:
    out: torch.Tensor  # [Q, H, D] fp32, normalised over this part's visible keys
    lse: torch.Tensor  # [Q, H] fp32, log-sum-exp of scaled scores; -inf where no key is visible


def visibility(
    q_positions: torch.Tensor, k_positions: torch.Tensor, window: int | None
) -> torch.Tensor | None:
    """[Q, T] True where a query may attend a key (causal, and within `window` positions);
    None when every query sees every key (a decode step over older KV). Both non-empty."""
    if int(k_positions.max()) <= int(q_positions.min()) and (
        window is None or int(k_positions.min()) > int(q_positions.max()) - window
    ):
        return None
    allowed = k_positions[None, :] <= q_positions[:, None]
    if window is not None:
        allowed &= k_positions[None, :] > q_positions[:, None] - window
    return allowed


def partial_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    *,
    scale: float,
    window: int | None = None,
) -> Partial:
    """q [Q, H, D] over k, v [T, KVH, D] (H % KVH == 0), positions [Q] and [T] -> Partial."""
    tokens, heads, dim = q.shape
    kv_heads = k.shape[1]
    if heads % kv_heads or k.shape != v.shape or k.shape[2] != dim:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    group = heads // kv_heads
    if k.shape[0] == 0 or tokens == 0:
        return empty_partial(tokens, heads, dim, q.device)
    allowed = visibility(q_positions, k_positions, window)
    # Rows ordered (query, group member): for one decode query every reshape is a view.
    rows = q.view(tokens, kv_heads, group, dim).transpose(0, 1).reshape(1, kv_heads, tokens * group, dim)
    keys, values = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)  # [1, KVH, T, D]
    row_mask = None if allowed is None else allowed.repeat_interleave(group, dim=0)  # [Q*G, T]
    if q.device.type == "cpu":
        out, lse = _flash_cpu(rows, keys, values, row_mask, scale)
    else:
        out, lse = _math(rows, keys, values, row_mask, scale)
    out = out[0].view(kv_heads, tokens, group, dim).transpose(0, 1).reshape(tokens, heads, dim)
    lse = lse[0].view(kv_heads, tokens, group).transpose(0, 1).reshape(tokens, heads)
    return Partial(out.float(), lse.float())


def _flash_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    bias = None
    if mask is not None:  # the kernel takes an additive mask of the query's dtype
        bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, float("-inf"))[None, None]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=bias, scale=scale
    )  # [1, KVH, rows, D], [1, KVH, rows]
    if mask is not None:
        lse = lse.masked_fill(~mask.any(dim=-1), float("-inf"))
    return out, lse


def _math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [1, KVH, rows, T]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [1, KVH, rows]
    weights = torch.exp(scores - lse.nan_to_num(neginf=0.0).unsqueeze(-1))  # 0 where masked
    return torch.matmul(weights, v.float()), lse


def empty_partial(tokens: int, heads: int, dim: int, device: torch.device) -> Partial:
    """The partial of a part with no keys: weighs nothing in a merge."""
    return Partial(
        torch.zeros(tokens, heads, dim, device=device),
        torch.full((tokens, heads), float("-inf"), device=device),
    )


def merge(parts: Sequence[Partial]) -> Partial:
    """The exact partial over the union of `parts`' keys (any number, any order)."""
    if len(parts) == 1:
        return parts[0]
    lse = torch.stack([p.lse for p in parts])  # [P, Q, H]
    peak = lse.amax(dim=0).nan_to_num(neginf=0.0)  # [Q, H]; 0 where no part sees a key
    weights = torch.exp(lse - peak)  # [P, Q, H], 0 for -inf
    total = weights.sum(dim=0)  # [Q, H]
    # Accumulated in place: stacking the outputs first (one [P, Q, H, D] tensor) measured
    # 30x slower on a CPU (a fresh large allocation per merge).
    out = torch.zeros_like(parts[0].out)
    for weight, part in zip(weights, parts, strict=True):
        out.addcmul_(part.out, weight.unsqueeze(-1))
    out /= total.clamp_min(torch.finfo(total.dtype).tiny).unsqueeze(-1)
    return Partial(out, peak + torch.log(total))
