"""bench-longctx's split measures real split-and-merge: the keys dealt to places cover
every key once, and the merged partials (one per place, one per block, blocks in one
kernel call) give monolithic attention within 1e-4."""

from __future__ import annotations

import torch

from bench.longctx.run import blocks_in_one_call, blocks_over_places
from inference_worker.dist_attention.partial import merge, partial_attention


def test_places_and_blocks_merge_to_monolithic_attention() -> None:
    gen = torch.Generator().manual_seed(0)
    keys, block = 4096, 512
    k, v = torch.randn(keys, 2, 64, generator=gen), torch.randn(keys, 2, 64, generator=gen)
    places = blocks_over_places(k, v, block, 3)
    assert sorted(torch.cat([at for _, _, at in places]).tolist()) == list(range(keys))
    for queries in (1, 64):
        q = torch.randn(queries, 8, 64, generator=gen)
        q_pos = range(keys - queries, keys)
        whole = partial_attention(q, k, v, q_pos, range(keys), scale=0.125)
        split = merge([partial_attention(q, pk, pv, q_pos, at, scale=0.125) for pk, pv, at in places])
        assert (split.out - whole.out).abs().max() <= 1e-4
        assert (split.lse - whole.lse).abs().max() <= 1e-4
    one_call = blocks_in_one_call(q[:1], k, v, block)  # one decode query at the last position
    decode = partial_attention(q[:1], k, v, range(keys - 1, keys), range(keys), scale=0.125)
    assert (one_call.out - decode.out).abs().max() <= 1e-4
