"""The one gather/scatter of attnstore_vllm.kv_layout against every packing vLLM uses,
on plain tensors: each packing is built from a reference `[2, B, H, N, D]` the way its
backend lays the memory out, then gathered blocks must equal the reference's tokens and
scattered blocks must land exactly where the backend reads them. The CPU layout is the
one measured from vLLM CPU 0.32's cache-write kernel (keys transposed within a block)."""

from __future__ import annotations

import pytest
import torch

from attnstore_vllm.kv_layout import KVLayoutError, KVPacking, gather_blocks, kv_views, scatter_blocks

B, H, N, D = 6, 2, 4, 8


def pack(reference: torch.Tensor, packing: KVPacking) -> torch.Tensor:
    """The backend's layer tensor holding `reference` [2, B, H, N, D]."""
    if packing is KVPacking.CPU_VEC:  # [B, H, N, 2D] whose interior is K as [D, N], then V as [N, D]
        k = reference[0].transpose(2, 3).reshape(B, H, N * D)
        v = reference[1].reshape(B, H, N * D)
        return torch.cat([k, v], dim=2).view(B, H, N, 2 * D)
    if packing is KVPacking.LAST_DIM:  # [B, H, N, 2D], K | V per token
        return reference.permute(1, 2, 3, 0, 4).reshape(B, H, N, 2 * D).contiguous()
    if packing is KVPacking.HEADS:  # [B, 2H, N, D]
        return reference.transpose(0, 1).reshape(B, 2 * H, N, D).contiguous()
    if packing is KVPacking.KV_FIRST:
        return reference.clone()
    return reference.permute(0, 1, 3, 2, 4).contiguous()  # KV_FIRST_NHD: [2, B, N, H, D]


def expected_tokens(reference: torch.Tensor, block_ids: list[int]) -> torch.Tensor:
    """[2, H, len * N, D]: the blocks' tokens in order."""
    return torch.cat([reference[:, b] for b in block_ids], dim=2)


@pytest.mark.parametrize("packing", list(KVPacking))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_reads_and_scatter_writes_the_backend_layout(packing: KVPacking, dtype: torch.dtype) -> None:
    reference = torch.randn(2, B, H, N, D).to(dtype)
    layer = pack(reference, packing)
    view = kv_views(layer, packing, H, D)
    assert all(part.untyped_storage().data_ptr() == layer.untyped_storage().data_ptr() for part in view)
    ids = [4, 1, 3]
    gathered = gather_blocks(view, torch.tensor(ids))
    assert gathered.is_contiguous()
    assert torch.equal(gathered, expected_tokens(reference, ids))

    fresh = torch.randn(2, H, 2 * N, D).to(dtype)
    scatter_blocks(view, torch.tensor([0, 5]), fresh)
    updated = reference.clone()
    updated[:, 0], updated[:, 5] = fresh[:, :, :N], fresh[:, :, N:]
    assert torch.equal(layer, pack(updated, packing))  # written in place, other blocks untouched


def test_cpu_layout_matches_what_the_cpu_kernel_writes() -> None:
    """vLLM CPU's vec kernels write token t's key element d of a block at d * N + t of the
    first half of kv_cache.view(B, H, 2N, D).chunk(2, dim=2)[0] (measured), its value row
    at t of the second half."""
    layer = torch.zeros(B, H, N, 2 * D)
    key_cache, value_cache = layer.view(B, H, 2 * N, D).chunk(2, dim=2)
    keys, values = torch.randn(N, D), torch.randn(N, D)
    key_cache[2, 1].view(-1).copy_(keys.t().reshape(-1))  # as the kernel lays them out
    value_cache[2, 1].copy_(values)
    gathered = gather_blocks(kv_views(layer, KVPacking.CPU_VEC, H, D), torch.tensor([2]))
    assert torch.equal(gathered[0, 1], keys) and torch.equal(gathered[1, 1], values)


def test_flash_layout_matches_how_flash_attention_splits_k_and_v() -> None:
    """vLLM's FLASH_ATTN: kv_cache.transpose(1, 2).split(D, dim=-1) gives K and V [B, N, H, D]."""
    layer = torch.randn(B, H, N, 2 * D)
    key_cache, value_cache = layer.transpose(1, 2).split(D, dim=-1)
    gathered = gather_blocks(kv_views(layer, KVPacking.LAST_DIM, H, D), torch.tensor([3]))
    assert torch.equal(gathered[0], key_cache[3].transpose(0, 1))
    assert torch.equal(gathered[1], value_cache[3].transpose(0, 1))


def test_shapes_that_do_not_match_the_model_are_refused() -> None:
    with pytest.raises(KVLayoutError):
        kv_views(torch.zeros(B, H + 1, N, 2 * D), KVPacking.CPU_VEC, H, D)
    with pytest.raises(KVLayoutError):
        kv_views(torch.zeros(B, H, N, D), KVPacking.HEADS, H, D)
    view = kv_views(torch.zeros(B, H, N, 2 * D), KVPacking.CPU_VEC, H, D)
    with pytest.raises(KVLayoutError):
        scatter_blocks(view, torch.tensor([0]), torch.zeros(2, H, N + 1, D))
