"""Between one layer of vLLM's paged KV cache and the chunk format's per-layer bytes.

A chunk layer is K then V, each `[kv_heads, tokens, head_dim]` (attnstore.chunks.format),
i.e. one contiguous `[2, kv_heads, tokens, head_dim]` tensor. vLLM 0.32 gives every
attention layer one tensor with blocks first (RFC #42082); how K and V share it depends on
the attention backend:

    KVPacking.TOKENS     CPU_ATTN          [B, H, N, 2*D]: per block and head, N rows of K
                                           then N rows of V          (viewed [B, H, 2, N, D])
    KVPacking.LAST_DIM   FLASH_ATTN,       [B, H, N, 2*D]: per token, K | V
                         TRITON_ATTN                                 (viewed [B, H, N, 2, D])
    KVPacking.HEADS      FLASHINFER        [B, 2*H, N, D]: H heads of K, then H of V
                                                                     (viewed [B, 2, H, N, D])
    KVPacking.KV_FIRST   vLLM <= 0.11 CPU  [2, B, H, N, D]
    KVPacking.KV_FIRST_NHD  vLLM <= 0.11 FA [2, B, N, H, D]

(B blocks, H kv heads, N tokens per block, D head dim.) Each packing is turned into one
strided view `[2, B, H, N, D]` of the same memory (no copy), so a single gather and a single
scatter serve every backend: gathering copies whole blocks out, scattering writes them in.
A chunk is always whole blocks (`chunk_tokens` is a multiple of the block size).
"""

from __future__ import annotations

import enum

import torch


class KVPacking(enum.Enum):
    TOKENS = "tokens"
    LAST_DIM = "last_dim"
    HEADS = "heads"
    KV_FIRST = "kv_first"
    KV_FIRST_NHD = "kv_first_nhd"


# vLLM attention backend name -> how it packs K and V into its layer tensor.
BACKEND_PACKINGS: dict[str, KVPacking] = {
    "CPU_ATTN": KVPacking.TOKENS,
    "FLASH_ATTN": KVPacking.LAST_DIM,
    "TRITON_ATTN": KVPacking.LAST_DIM,
    "FLASHINFER": KVPacking.HEADS,
}


class KVLayoutError(ValueError):
    """A KV tensor does not have the shape its packing and the model's heads imply."""


def canonical_view(kv_layer: torch.Tensor, packing: KVPacking, kv_heads: int, head_dim: int) -> torch.Tensor:
    """The layer's cache as a `[2, blocks, kv_heads, block_tokens, head_dim]` view (no copy);
    writes into the view land in the cache."""
    h, d = kv_heads, head_dim
    shape = tuple(kv_layer.shape)
    if packing is KVPacking.KV_FIRST:
        if len(shape) != 5 or shape[0] != 2 or shape[2] != h or shape[4] != d:
            raise KVLayoutError(f"expected [2, B, {h}, N, {d}], got {list(shape)}")
        return kv_layer
    if packing is KVPacking.KV_FIRST_NHD:
        if len(shape) != 5 or shape[0] != 2 or shape[3] != h or shape[4] != d:
            raise KVLayoutError(f"expected [2, B, N, {h}, {d}], got {list(shape)}")
        return kv_layer.permute(0, 1, 3, 2, 4)
    if len(shape) != 4:
        raise KVLayoutError(f"expected a 4-d [B, H, N, C] layer, got {list(shape)}")
    blocks, heads, tokens, width = shape
    if packing is KVPacking.HEADS:
        if heads != 2 * h or width != d:
            raise KVLayoutError(f"expected [B, {2 * h}, N, {d}], got {list(shape)}")
        return kv_layer.unflatten(1, (2, h)).transpose(0, 1)  # [B, 2, H, N, D] -> [2, B, H, N, D]
    if heads != h or width != 2 * d:
        raise KVLayoutError(f"expected [B, {h}, N, {2 * d}], got {list(shape)}")
    if packing is KVPacking.LAST_DIM:
        return kv_layer.unflatten(3, (2, d)).permute(3, 0, 1, 2, 4)  # [B, H, N, 2, D] -> [2, B, H, N, D]
    # TOKENS: the block interior [N, 2D] is N*2D contiguous values: N rows of K, then N of V.
    if kv_layer.stride(3) != 1 or kv_layer.stride(2) != width:
        raise KVLayoutError("the CPU layout needs each block's [N, 2*D] interior contiguous")
    split = kv_layer.as_strided(
        (blocks, heads, 2, tokens, d),
        (kv_layer.stride(0), kv_layer.stride(1), tokens * d, d, 1),
        kv_layer.storage_offset(),
    )
    return split.permute(2, 0, 1, 3, 4)


def gather_blocks(view: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """A new contiguous `[2, kv_heads, len(block_ids) * block_tokens, head_dim]` tensor: the
    blocks' tokens in order (a chunk layer's K then V)."""
    _, _, heads, block_tokens, head_dim = view.shape
    picked = view[:, block_ids]  # [2, n, H, N, D], a copy
    tokens = picked.permute(0, 2, 1, 3, 4).reshape(2, heads, len(block_ids) * block_tokens, head_dim)
    return tokens.contiguous()  # a no-op unless indexing kept the backend's strides


def scatter_blocks(view: torch.Tensor, block_ids: torch.Tensor, layer: torch.Tensor) -> None:
    """Writes `layer` `[2, kv_heads, len(block_ids) * block_tokens, head_dim]` into the blocks."""
    _, _, heads, block_tokens, head_dim = view.shape
    expected = (2, heads, len(block_ids) * block_tokens, head_dim)
    if tuple(layer.shape) != expected:
        raise KVLayoutError(f"layer of shape {list(layer.shape)} for blocks of shape {list(expected)}")
    view[:, block_ids] = layer.view(2, heads, len(block_ids), block_tokens, head_dim).permute(0, 2, 1, 3, 4)
