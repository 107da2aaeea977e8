"""Writing K and V into the pool: consecutive slots (a prefix loaded into a run of blocks)
are written by one copy, any other slots by index; both put each token where it belongs."""

from __future__ import annotations

import pytest
import torch

from inference_worker.engine.attention import PagedKV, slot_run, slots_of
from inference_worker.model_geometry import ModelGeometry

GEOMETRY = ModelGeometry(num_layers=2, heads=6, kv_heads=2, head_dim=8, max_positions=256, vocab_size=8)
BLOCK = 4


def test_consecutive_slots_are_a_slice() -> None:
    assert slot_run(slots_of([3, 4, 5], BLOCK, 2, 11), torch.device("cpu")) == slice(14, 23)
    scattered = slot_run(slots_of([3, 1, 5], BLOCK, 2, 11), torch.device("cpu"))
    assert isinstance(scattered, torch.Tensor)
    assert scattered.tolist() == [14, 15, 4, 5, 6, 7, 20, 21, 22]


@pytest.mark.parametrize("table", [[3, 4, 5], [3, 1, 5]])
def test_every_token_lands_in_its_slot(table: list[int]) -> None:
    generator = torch.Generator().manual_seed(len(table) + table[1])
    kv = PagedKV(GEOMETRY, 8, BLOCK, torch.float32, torch.device("cpu"))
    kv.k.zero_(), kv.v.zero_()
    slots = slots_of(table, BLOCK, 2, 11)
    k = torch.randn(len(slots), GEOMETRY.kv_heads, GEOMETRY.head_dim, generator=generator)
    v = torch.randn(len(slots), GEOMETRY.kv_heads, GEOMETRY.head_dim, generator=generator)
    kv.write(1, slot_run(slots, torch.device("cpu")), k, v)
    flat_k = kv.k[1].view(GEOMETRY.kv_heads, -1, GEOMETRY.head_dim)
    flat_v = kv.v[1].view(GEOMETRY.kv_heads, -1, GEOMETRY.head_dim)
    assert torch.equal(flat_k[:, slots], k.transpose(0, 1))
    assert torch.equal(flat_v[:, slots], v.transpose(0, 1))
    others = [slot for slot in range(flat_k.shape[1]) if slot not in slots]
    assert not flat_k[:, others].any() and not flat_v[:, others].any()  # nothing else written
    assert not kv.k[0].any()  # nor another layer
