"""A prefill chunk after earlier KV, attended as two unmasked flash calls merged by their
log-sum-exps, gives what one SDPA call with the chunk's causal mask over all keys gives."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference_worker.engine.chunk_attention import prefix_then_chunk

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("earlier", "new"), [(1, 2), (5, 37), (200, 64), (64, 300)])
def test_matches_one_masked_call(dtype: torch.dtype, earlier: int, new: int) -> None:
    generator = torch.Generator().manual_seed(earlier * 1000 + new)
    heads, kv_heads, dim = 6, 2, 16  # grouped query heads: three per KV head
    q = torch.randn(1, heads, new, dim, generator=generator).to(dtype)
    k = torch.randn(kv_heads, earlier + new, dim, generator=generator).to(dtype)
    v = torch.randn(kv_heads, earlier + new, dim, generator=generator).to(dtype)
    allowed = torch.arange(earlier + new)[None, :] <= torch.arange(earlier, earlier + new)[:, None]
    want = F.scaled_dot_product_attention(
        q.float(), k.float()[None], v.float()[None], attn_mask=allowed, scale=0.3, enable_gqa=True
    )
    got = prefix_then_chunk(q, (k[:, :earlier], v[:, :earlier]), (k[:, earlier:], v[:, earlier:]), 0.3)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), want, atol=TOLERANCE[dtype], rtol=0)
