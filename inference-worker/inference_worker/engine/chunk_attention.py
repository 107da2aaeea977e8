"""A prefill chunk's attention on a CPU after KV already in the pool, without a mask.

The chunk's queries see every earlier key and their own chunk's keys causally. As one SDPA
call that needs a boolean [new, context] mask, which torch's CPU flash kernel reads for
every block of scores (never skipping the masked ones) after SDPA has converted it to an
additive one. Here it is two unmasked flash calls: all queries over the earlier keys, and
the chunk over its own keys with `is_causal` (square, so torch's top-left alignment is the
right one, and the kernel skips the blocks above the diagonal); the two partial softmaxes
are merged by their log-sum-exps (DistAttention's `merge_two`), as flash-attention merges
its blocks. One layer of SmolLM2 (9 query heads on 3 KV heads), 1,000 new tokens after
2,000, one thread, CPU time at load 9: 107 -> 81 ms, at most 2.4e-7 from the masked call.
fp32 pools on a CPU take the C prefill kernel instead (prefill_kernel.py) where it loads; this
runs the rest (bf16 pools, no compiler).
"""

from __future__ import annotations

import torch

from inference_worker.dist_attention.partial import Partial, merge_two

# Returns the log-sum-exp beside the output (SDPA drops it); takes grouped heads as they are.
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def prefix_then_chunk(
    query: torch.Tensor,
    earlier: tuple[torch.Tensor, torch.Tensor],
    own: tuple[torch.Tensor, torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """query [1, heads, new, D]; `earlier` K, V [kv_heads, start, D] (seen by every query),
    `own` K, V [kv_heads, new, D] (the chunk's, seen causally) -> [1, heads, new, D]."""
    before, before_lse = _flash(query, earlier[0][None], earlier[1][None], 0.0, False, scale=scale)
    after, after_lse = _flash(query, own[0][None], own[1][None], 0.0, True, scale=scale)
    # softmax over both = each part's softmax weighted by its share of the mass, e^lse; every
    # query sees at least its own key
    merged = merge_two(
        Partial(after.float(), after_lse), Partial(before.float(), before_lse), every_row_seen=True
    )
    return merged.out.to(query.dtype)
