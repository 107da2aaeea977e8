"""Paged KV storage and attention through block tables.

The pool's KV is two preallocated tensors, K and V [layers, blocks, block_tokens, kv_heads,
head_dim]; a token's KV lives in slot `block * block_tokens + offset` of its layer. A
forward pass writes the new tokens' K and V to their slots (`slot_mapping`), then each
sequence attends over the slots its block table names.

Decisions:
- Grouped-query attention without repeating KV heads: torch's SDPA with `enable_gqa`
  (on a CPU its flash kernel takes grouped heads and a mask; measured bit-identical to
  repeating them, and a third of the time of a long-context forward, cpu_attention.py).
- A sequence with no earlier KV (a whole prefill without a prefix hit) attends over its
  new K and V directly, as transformers does: no gather.
- A block table that is one run of consecutive blocks (the common case in a fresh pool)
  is read as a view of the pool; otherwise its blocks are gathered (one copy per layer,
  what DynamicCache's per-step concatenation costs anyway). A CUDA build would hand the
  table to a paged kernel (flash-attn's `block_table`); the torch path below runs there too.
- Sliding-window layers (Mistral, some Qwen2) mask keys more than `window` positions back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from inference_worker.model_geometry import ModelGeometry


class PagedKV:
    """The KV pool's tensors on one device."""

    def __init__(
        self,
        geometry: ModelGeometry,
        num_blocks: int,
        block_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (geometry.num_layers, num_blocks, block_tokens, geometry.kv_heads, geometry.head_dim)
        # Uninitialized: a slot is always written before any query reads it, and pages a
        # large CPU pool never uses are never touched.
        self.k = torch.empty(shape, dtype=dtype, device=device)  # [L, blocks, B, kv_heads, D]
        self.v = torch.empty(shape, dtype=dtype, device=device)  # [L, blocks, B, kv_heads, D]
        self.block_tokens = block_tokens
        self.kv_heads = geometry.kv_heads
        self.head_dim = geometry.head_dim

    @staticmethod
    def bytes_per_block(geometry: ModelGeometry, block_tokens: int, element_bytes: int) -> int:
        return block_tokens * geometry.kv_bytes_per_token(element_bytes)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [tokens, kv_heads, D] into `slots` [tokens] of `layer`."""
        shape = (-1, self.kv_heads, self.head_dim)
        self.k[layer].view(shape).index_copy_(0, slots, k)
        self.v[layer].view(shape).index_copy_(0, slots, v)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy-on-write: block `src`'s KV, every layer, into `dst`."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    def span(self, table: list[int], start: int, stop: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of the KV of a sequence's tokens [start, stop): per layer K, V [kv_heads,
        stop - start, D] (what the chunk codec saves)."""
        slots = torch.tensor(
            slots_of(table, self.block_tokens, start, stop), dtype=torch.long, device=self.k.device
        )
        flat = (self.k.shape[0], -1, self.kv_heads, self.head_dim)
        k = self.k.view(flat)[:, slots].transpose(1, 2).contiguous()  # [L, kv_heads, tokens, D]
        v = self.v.view(flat)[:, slots].transpose(1, 2).contiguous()  # [L, kv_heads, tokens, D]
        return list(zip(k.unbind(0), v.unbind(0), strict=True))

    def context(self, layer: int, blocks: BlockRun, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [kv_heads, tokens, D] of a sequence's first `tokens` tokens."""
        if isinstance(blocks, slice):  # consecutive blocks: a view
            k, v = self.k[layer, blocks], self.v[layer, blocks]  # [n, B, kv_heads, D]
        else:
            k, v = self.k[layer, blocks], self.v[layer, blocks]  # gathered [n, B, kv_heads, D]
        shape = (-1, self.kv_heads, self.head_dim)
        return k.reshape(shape)[:tokens].transpose(0, 1), v.reshape(shape)[:tokens].transpose(0, 1)


def slots_of(table: list[int], block_tokens: int, start: int, stop: int) -> list[int]:
    """The pool slots of a sequence's tokens [start, stop), through its block table."""
    return [table[p // block_tokens] * block_tokens + p % block_tokens for p in range(start, stop)]


BlockRun = slice | torch.Tensor  # a sequence's blocks: a consecutive run, or the table's ids


@dataclass
class SequenceSlice:
    """One sequence's share of a batched forward pass."""

    rows: slice  # its new tokens' rows in the flattened batch
    start: int  # position of its first new token = tokens whose KV is already in the pool
    blocks: BlockRun
    # Positions of its context slots [0, context_tokens) when the sequence has explicit ones
    # (prompt modules): a query then sees the keys at positions up to its own, not the slots
    # before it. None: slot i sits at position i.
    positions: torch.Tensor | None = None
    _masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return self.rows.stop - self.rows.start

    @property
    def context_tokens(self) -> int:
        return self.start + self.new_tokens

    @property
    def self_contained(self) -> bool:
        """No earlier KV and slot order is position order: causal attention over its own K, V."""
        return self.start == 0 and self.positions is None

    def mask(self, window: int | None, device: torch.device) -> torch.Tensor | None:
        """[new, context] True where a query may attend; None where no key needs masking."""
        if (
            self.new_tokens == 1
            and self.positions is None
            and (window is None or self.context_tokens <= window)
        ):
            return None  # a decode token sees everything before it
        if window not in self._masks:
            if self.positions is None:
                query = torch.arange(self.start, self.context_tokens, device=device)[:, None]  # [new, 1]
                key = torch.arange(self.context_tokens, device=device)[None, :]  # [1, context]
            else:
                query = self.positions[self.start :, None]  # [new, 1]
                key = self.positions[None, :]  # [1, context]
            allowed = key <= query
            if window is not None:
                allowed &= key > query - window
            self._masks[window] = allowed
        return self._masks[window]


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: PagedKV,
    layer: int,
    slices: list[SequenceSlice],
    *,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """q [tokens, heads, D], the new k, v [tokens, kv_heads, D] (already in the pool) ->
    attention output [tokens, heads, D], each sequence over its own context."""
    out = torch.empty_like(q)
    for part in slices:
        query = q[part.rows].transpose(0, 1).unsqueeze(0)  # [1, heads, new, D]
        if part.self_contained and (window is None or part.new_tokens <= window):
            keys, values = k[part.rows].transpose(0, 1), v[part.rows].transpose(0, 1)  # [kv_heads, new, D]
            mask, causal = None, part.new_tokens > 1
        else:
            keys, values = kv.context(layer, part.blocks, part.context_tokens)  # [kv_heads, context, D]
            mask, causal = part.mask(window, q.device), False
        attended = F.scaled_dot_product_attention(
            query,
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            scale=scale,
            enable_gqa=True,
        )  # [1, heads, new, D]
        out[part.rows] = attended[0].transpose(0, 1)
    return out
