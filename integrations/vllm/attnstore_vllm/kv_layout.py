"""Between one layer of vLLM's paged KV cache and the chunk format's per-layer bytes.

A chunk layer is K then V, each `[kv_heads, tokens, head_dim]` (attnstore.chunks.format),
i.e. one contiguous `[2, kv_heads, tokens, head_dim]` tensor. vLLM 0.32 gives every
attention layer one tensor with blocks first (RFC #42082); where K and V lie in it depends
on the attention backend (B blocks, H kv heads, N tokens per block, D head dim):

    KVPacking.CPU_VEC       CPU_ATTN, isa vec/vec16   [B, H, N, 2*D]; per block and head,
                            K as [D, N] (transposed), then V as [N, D]
    KVPacking.LAST_DIM      FLASH_ATTN, TRITON_ATTN   [B, H, N, 2*D]; per token K | V
    KVPacking.HEADS         FLASHINFER                [B, 2*H, N, D]; H heads of K, then of V
    KVPacking.KV_FIRST      vLLM <= 0.11, CPU         [2, B, H, N, D]
    KVPacking.KV_FIRST_NHD  vLLM <= 0.11, FlashAttn   [2, B, N, H, D]

The CPU layout was measured by calling vLLM's own cache-write kernel on known values
(`cpu_attn_reshape_and_cache`): its vec kernels keep a block's keys transposed. Its AMX
kernel (bf16 on CPUs with AMX) packs keys in VNNI pairs and is not supported.

Each packing becomes two strided views, K and V, each `[B, H, N, D]` over the same memory
(no copy), so one gather and one scatter serve every backend: gathering copies whole
blocks out, scattering writes them in. A chunk is always whole blocks.
"""

from __future__ import annotations

import enum

import torch


class KVPacking(enum.Enum):
    CPU_VEC = "cpu_vec"
    LAST_DIM = "last_dim"
    HEADS = "heads"
    KV_FIRST = "kv_first"
    KV_FIRST_NHD = "kv_first_nhd"


# vLLM attention backend name -> how it packs K and V (CPU_ATTN: for its vec kernels).
BACKEND_PACKINGS: dict[str, KVPacking] = {
    "CPU_ATTN": KVPacking.CPU_VEC,
    "FLASH_ATTN": KVPacking.LAST_DIM,
    "TRITON_ATTN": KVPacking.LAST_DIM,
    "FLASHINFER": KVPacking.HEADS,
}
CPU_VEC_ISAS = frozenset({"vec", "vec16"})

KVViews = tuple[torch.Tensor, torch.Tensor]  # K, V: each [blocks, kv_heads, block_tokens, head_dim]


class KVLayoutError(ValueError):
    """A KV tensor does not have the shape its packing and the model's heads imply."""


def kv_views(kv_layer: torch.Tensor, packing: KVPacking, kv_heads: int, head_dim: int) -> KVViews:
    """The layer's K and V as `[blocks, kv_heads, block_tokens, head_dim]` views (no copy);
    writes into them land in the cache."""
    h, d = kv_heads, head_dim
    shape = list(kv_layer.shape)
    if packing in (KVPacking.KV_FIRST, KVPacking.KV_FIRST_NHD):
        heads_at = 2 if packing is KVPacking.KV_FIRST else 3
        if len(shape) != 5 or shape[0] != 2 or shape[heads_at] != h or shape[4] != d:
            raise KVLayoutError(f"expected {h} heads of {d} at dims {heads_at}, 4 of [2, ...], got {shape}")
        k, v = kv_layer[0], kv_layer[1]
        return (k, v) if packing is KVPacking.KV_FIRST else (k.transpose(1, 2), v.transpose(1, 2))
    if len(shape) != 4:
        raise KVLayoutError(f"expected a 4-d [B, H, N, C] layer, got {shape}")
    blocks, heads, tokens, width = shape
    if packing is KVPacking.HEADS:
        if heads != 2 * h or width != d:
            raise KVLayoutError(f"expected [B, {2 * h}, N, {d}], got {shape}")
        return kv_layer[:, :h], kv_layer[:, h:]
    if heads != h or width != 2 * d:
        raise KVLayoutError(f"expected [B, {h}, N, {2 * d}], got {shape}")
    if packing is KVPacking.LAST_DIM:
        return kv_layer[..., :d], kv_layer[..., d:]
    # CPU_VEC: a block's [N, 2D] interior is N*D values of K as [D, N], then N*D of V as [N, D].
    if kv_layer.stride(3) != 1 or kv_layer.stride(2) != width:
        raise KVLayoutError("the CPU layout needs each block's [N, 2*D] interior contiguous")
    outer = (kv_layer.stride(0), kv_layer.stride(1))
    offset = kv_layer.storage_offset()
    k = kv_layer.as_strided((blocks, heads, tokens, d), (*outer, 1, tokens), offset)
    v = kv_layer.as_strided((blocks, heads, tokens, d), (*outer, d, 1), offset + tokens * d)
    return k, v


def gather_blocks(views: KVViews, block_ids: torch.Tensor) -> torch.Tensor:
    """A new contiguous `[2, kv_heads, len(block_ids) * block_tokens, head_dim]` tensor: the
    blocks' tokens in order (a chunk layer's K then V)."""
    _, heads, block_tokens, head_dim = views[0].shape
    picked = torch.stack([view[block_ids] for view in views])  # [2, n, H, N, D]
    tokens = picked.permute(0, 2, 1, 3, 4).reshape(2, heads, len(block_ids) * block_tokens, head_dim)
    return tokens.contiguous()  # a no-op unless the reshape kept strides


def scatter_blocks(views: KVViews, block_ids: torch.Tensor, layer: torch.Tensor) -> None:
    """Writes `layer` `[2, kv_heads, len(block_ids) * block_tokens, head_dim]` into the blocks."""
    _, heads, block_tokens, head_dim = views[0].shape
    expected = [2, heads, len(block_ids) * block_tokens, head_dim]
    if list(layer.shape) != expected:
        raise KVLayoutError(f"layer of shape {list(layer.shape)} for blocks of shape {expected}")
    per_block = layer.view(2, heads, len(block_ids), block_tokens, head_dim).permute(0, 2, 1, 3, 4)
    for view, values in zip(views, per_block, strict=True):
        view[block_ids] = values
