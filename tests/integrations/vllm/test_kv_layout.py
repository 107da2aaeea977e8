"""The one gather/scatter of attnstore_vllm.kv_layout against every packing vLLM uses,
on plain tensors: each packing is built from a reference `[2, B, H, N, D]` the way its
backend lays the memory out, then gathered blocks must equal the reference's tokens and
scattered blocks must land exactly where the backend reads them."""

from __future__ import annotations

import pytest
import torch

from attnstore_vllm.kv_layout import KVLayoutError, KVPacking, canonical_view, gather_blocks, scatter_blocks

B, H, N, D = 6, 2, 4, 8


def pack(reference: torch.Tensor, packing: KVPacking) -> torch.Tensor:
    """The backend's layer tensor holding `reference` [2, B, H, N, D]."""
    if packing is KVPacking.TOKENS:  # [B, H, N, 2D] whose interior is N rows of K then N of V
        return reference.permute(1, 2, 0, 3, 4).reshape(B, H, 2 * N, D).reshape(B, H, N, 2 * D).contiguous()
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
    view = canonical_view(layer, packing, H, D)
    assert view.data_ptr() == layer.data_ptr()  # a view, not a copy
    ids = [4, 1, 3]
    gathered = gather_blocks(view, torch.tensor(ids))
    assert gathered.is_contiguous()
    assert torch.equal(gathered, expected_tokens(reference, ids))

    fresh = torch.randn(2, H, 2 * N, D).to(dtype)
    scatter_blocks(view, torch.tensor([0, 5]), fresh)
    updated = reference.clone()
    updated[:, 0], updated[:, 5] = fresh[:, :, :N], fresh[:, :, N:]
    assert torch.equal(layer, pack(updated, packing))  # written in place, other blocks untouched


def test_cpu_layout_matches_how_the_cpu_backend_splits_k_and_v() -> None:
    """vLLM's CPU_ATTN: kv_cache.view(B, H, 2N, D).chunk(2, dim=2) gives K and V."""
    layer = torch.randn(B, H, N, 2 * D)
    key_cache, value_cache = layer.view(B, H, 2 * N, D).chunk(2, dim=2)
    gathered = gather_blocks(canonical_view(layer, KVPacking.TOKENS, H, D), torch.tensor([2]))
    assert torch.equal(gathered[0], key_cache[2]) and torch.equal(gathered[1], value_cache[2])


def test_flash_layout_matches_how_flash_attention_splits_k_and_v() -> None:
    """vLLM's FLASH_ATTN: kv_cache.transpose(1, 2).split(D, dim=-1) gives K and V [B, N, H, D]."""
    layer = torch.randn(B, H, N, 2 * D)
    key_cache, value_cache = layer.transpose(1, 2).split(D, dim=-1)
    gathered = gather_blocks(canonical_view(layer, KVPacking.LAST_DIM, H, D), torch.tensor([3]))
    assert torch.equal(gathered[0], key_cache[3].transpose(0, 1))
    assert torch.equal(gathered[1], value_cache[3].transpose(0, 1))


def test_shapes_that_do_not_match_the_model_are_refused() -> None:
    with pytest.raises(KVLayoutError):
        canonical_view(torch.zeros(B, H + 1, N, 2 * D), KVPacking.TOKENS, H, D)
    with pytest.raises(KVLayoutError):
        canonical_view(torch.zeros(B, H, N, D), KVPacking.HEADS, H, D)
    view = canonical_view(torch.zeros(B, H, N, 2 * D), KVPacking.TOKENS, H, D)
    with pytest.raises(KVLayoutError):
        scatter_blocks(view, torch.tensor([0]), torch.zeros(2, H, N + 1, D))
