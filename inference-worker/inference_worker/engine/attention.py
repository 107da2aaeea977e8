"""Paged KV storage and attention through block tables.

The pool's KV is two preallocated tensors, K and V [layers, kv_heads, blocks, block_tokens,
head_dim]; a token's KV lives in slot `block * block_tokens + offset` of its layer and head.
A forward pass writes the new tokens' K and V to their slots (`slot_mapping`), then each
sequence attends over the slots its block table names.

Decisions:
- Grouped-query attention without repeating KV heads: torch's SDPA with `enable_gqa`
  (on a CPU its flash kernel takes grouped heads and a mask; measured bit-identical to
  repeating them, and a third of the time of a long-context forward, cpu_attention.py).
- Heads outermost in a layer: one head's block is one [B, D] run of memory, so a
  sequence's keys are a view or a copy of unit row stride.
- Decode tokens on a CPU: one call per layer of the C decode kernel for all of them
  (decode_kernel.py), reading each sequence's blocks where they lie; a 16-sequence decode
  step no longer gathers or calls SDPA per sequence. What follows is the path of
  everything else (prefill chunks, prompt modules' explicit positions, CUDA, and decodes
  where the kernel is unavailable).
- A sequence with no earlier KV (a whole prefill without a prefix hit) attends over its
  new K and V directly, as transformers does: no gather. A block table that is one run of
  consecutive blocks (the common case in a fresh pool) is read as a view of the pool.
  Every other table of the step is gathered by one copy per layer into buffers kept
  across layers and steps (`Batch.gathered`), each sequence's keys a view of that copy.
  Then each sequence attends in its own SDPA call: one call for all decode tokens, padded
  to the longest with a key-padding mask, was slower on a CPU (16 sequences of 300-1,050
  tokens, one layer: 3.4-4.8 ms against 2.6-2.9 ms for the 16 unmasked calls; the
  padding adds half the keys there). What the calls cost before was the gathers, one a
  sequence (below, `PagedKV.gather`). On a GPU, where the calls' host time is what costs,
  decode tokens take that padded batch (decode_batched.py); prefill chunks run the torch
  path below there too (a paged kernel such as flash-attn's `block_table` is not wired).
- Prefill chunks of fp32 pools on a CPU: one call per layer of the C prefill kernel for
  all of them (prefill_kernel.py), reading each chunk's context where it lies in the pool;
  one layer of 480 new tokens on 1,250, one thread: 26.0 -> 18.1 ms against the two flash
  calls below. Prompt modules' explicit positions, contexts past a sliding window, bf16 and
  CUDA pools keep the SDPA paths here.
- A prefill chunk after earlier KV on a CPU otherwise needs no mask: its queries over the
  earlier keys plus its own keys causally, two flash calls merged by their log-sum-exps
  (chunk_attention.py; one layer of 1,000 tokens on 2,000: 107 -> 81 ms).
- Sliding-window layers (Mistral, some Qwen2) mask keys more than `window` positions back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from inference_worker.engine.chunk_attention import prefix_then_chunk
from inference_worker.engine.prefix_in_place import DeferredWrites
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
        shape = (geometry.num_layers, geometry.kv_heads, num_blocks, block_tokens, geometry.head_dim)
        # Uninitialized: a slot is always written before any query reads it, and pages a
        # large CPU pool never uses are never touched. In 4 KB pages: transparent huge pages
        # (MADV_HUGEPAGE) cost more than they gave (docs/inference-worker.md, fifth pass).
        self.k = torch.empty(shape, dtype=dtype, device=device)  # [L, kv_heads, blocks, B, D]
        self.v = torch.empty(shape, dtype=dtype, device=device)  # [L, kv_heads, blocks, B, D]
        self.block_tokens = block_tokens
        self.kv_heads = geometry.kv_heads
        self.head_dim = geometry.head_dim
        self._gathered: tuple[torch.Tensor, torch.Tensor] | None = None  # `gather`'s K, V buffers
        self.deferred = DeferredWrites(self.write)  # prefixes attended in place, not yet in their blocks

    @staticmethod
    def bytes_per_block(geometry: ModelGeometry, block_tokens: int, element_bytes: int) -> int:
        return block_tokens * geometry.kv_bytes_per_token(element_bytes)

    def write(self, layer: int, slots: torch.Tensor | slice, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [tokens, kv_heads, D] into `slots` of `layer`: a tensor [tokens] of slots, or
        a slice of consecutive ones (`slot_run`), written by a plain copy. K and V of a
        4,096-token SmolLM2 prefix, all 30 layers (188 MB), one thread, median CPU time at
        load 11-14: index_copy_ 22-23 ms, the copy 20-21 ms (both bound by memory; from a
        source already in cache, one layer's K: 0.40 vs 0.10 ms)."""
        shape = (self.kv_heads, -1, self.head_dim)
        if isinstance(slots, slice):
            self.k[layer].view(shape)[:, slots].copy_(k.transpose(0, 1))
            self.v[layer].view(shape)[:, slots].copy_(v.transpose(0, 1))
            return
        self.k[layer].view(shape).index_copy_(1, slots, k.transpose(0, 1))
        self.v[layer].view(shape).index_copy_(1, slots, v.transpose(0, 1))

    def copy_block(self, src: int, dst: int) -> None:
        """Copy-on-write: block `src`'s KV, every layer, into `dst`."""
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]

    def span(self, table: list[int], start: int, stop: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of the KV of a sequence's tokens [start, stop): per layer K, V [kv_heads,
        stop - start, D] (what the chunk codec saves)."""
        slots = self.slot_tensor(table, start, stop)
        return [self.layer_span(layer, slots) for layer in range(self.k.shape[0])]

    def slot_tensor(self, table: list[int], start: int, stop: int) -> torch.Tensor:
        """The pool slots of a sequence's tokens [start, stop) (`slots_of`), for `layer_span`.
        Flushes first: a prefix attended in place is copied into its blocks before they are read."""
        self.deferred.flush()
        slots = slots_of(table, self.block_tokens, start, stop)
        return torch.tensor(slots, dtype=torch.long, device=self.k.device)

    def layer_span(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of `layer`'s K, V [kv_heads, len(slots), D] at `slots`: a caller that
        consumes one layer at a time holds one layer's copy, not all (a 4k-token SmolLM2
        segment's 30 layers are ~190 MB)."""
        # index_select: 20 ms for 640 slots of SmolLM2's 30 layers, indexing ([:, :, slots]) 30
        flat = (self.kv_heads, -1, self.head_dim)
        k, v = self.k[layer].view(flat), self.v[layer].view(flat)
        return k.index_select(1, slots), v.index_select(1, slots)

    def context(self, layer: int, blocks: slice, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [kv_heads, tokens, D] of a sequence's first `tokens` tokens, its blocks a
        consecutive run: views of the pool."""
        shape = (self.kv_heads, -1, self.head_dim)
        k, v = self.k[layer][:, blocks], self.v[layer][:, blocks]  # [kv_heads, n, B, D]
        return k.reshape(shape)[:, :tokens], v.reshape(shape)[:, :tokens]

    def gather(self, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [kv_heads, len(blocks) * B, D] of `blocks`, copied into buffers that the
        next call overwrites."""
        # Over [kv_heads, blocks, B * D]: 4-d (or indexed as pool[layer][:, blocks]), torch
        # took 12.5 ms for 16 sequences' blocks of one layer, 3-d 1.1 ms. Into buffers kept
        # from layer to layer and step to step: fresh ones (13 MB each there) went back to
        # the OS after every layer (glibc trims its heap) and cost ~20 ms of page faults a
        # layer to get back. They hold one layer of the largest step's gathered KV.
        rows = (self.kv_heads, self.k.shape[2], -1)
        gathered = (self.kv_heads, blocks.shape[0], self.block_tokens * self.head_dim)
        elements = gathered[0] * gathered[1] * gathered[2]
        if self._gathered is None or self._gathered[0].numel() < elements:
            self._gathered = (self.k.new_empty(elements), self.v.new_empty(elements))
        k_out, v_out = (buffer[:elements].view(gathered) for buffer in self._gathered)
        torch.index_select(self.k[layer].view(rows), 1, blocks, out=k_out)
        torch.index_select(self.v[layer].view(rows), 1, blocks, out=v_out)
        shape = (self.kv_heads, -1, self.head_dim)
        return k_out.view(shape), v_out.view(shape)


def slots_of(table: list[int], block_tokens: int, start: int, stop: int) -> list[int]:
    """The pool slots of a sequence's tokens [start, stop), through its block table."""
    return [table[p // block_tokens] * block_tokens + p % block_tokens for p in range(start, stop)]


def slot_run(slots: list[int], device: torch.device) -> torch.Tensor | slice:
    """`slots` as a slice when they are consecutive (`PagedKV.write` copies them as one run),
    else as a tensor."""
    if slots and slots == list(range(slots[0], slots[0] + len(slots))):
        return slice(slots[0], slots[0] + len(slots))
    return torch.tensor(slots, dtype=torch.long, device=device)


@dataclass
class SequenceSlice:
    """One sequence's share of a batched forward pass."""

    rows: slice  # its new tokens' rows in the flattened batch
    start: int  # position of its first new token = tokens whose KV is already in the pool
    # Its blocks when they are one consecutive run (read in place); None: gathered with the
    # step's other tables (`Batch.gathered`), its first token at row `gathered_at` there.
    blocks: slice | None
    # Positions of its context slots [0, context_tokens) when the sequence has explicit ones
    # (prompt modules): a query then sees the keys at positions up to its own, not the slots
    # before it. None: slot i sits at position i.
    positions: torch.Tensor | None = None
    gathered_at: int = 0
    # its attention is a C kernel's (the decode kernel's `DecodeTables`, the prefill kernel's
    # `PrefillTables`), not an SDPA call
    kernel: bool = False
    far: bool = False  # its attention is merged with its far KV's (far_kv.py), not an SDPA call
    in_place: bool = False  # it attends its stored prefix where it was read (prefix_in_place.py)
    _masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return self.rows.stop - self.rows.start

    @property
    def context_tokens(self) -> int:
        return self.start + self.new_tokens

    @property
    def is_decode(self) -> bool:
        """One new token after earlier KV, slot order being position order (the decode kernel's case)."""
        return self.new_tokens == 1 and self.start > 0 and self.positions is None

    @property
    def self_contained(self) -> bool:
        """No earlier KV and slot order is position order: causal attention over its own K, V."""
        return self.start == 0 and self.positions is None

    def unmasked_split(self, window: int | None, device: torch.device) -> bool:
        """Whether its attention runs as earlier keys + its own causally (chunk_attention.py):
        a chunk after earlier KV, slot order being position order, within any window, on a CPU."""
        return (
            device.type == "cpu"
            and self.new_tokens > 1
            and self.start > 0
            and self.positions is None
            and (window is None or self.context_tokens <= window)
        )

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


@dataclass(frozen=True)
class DecodeTables:
    """A step's decode tokens for the decode kernel, built once per step."""

    rows: torch.Tensor  # [decodes] int64: each decode token's row in the flattened batch
    tables: torch.Tensor  # [decodes, most blocks] int32: block tables, padded with block 0
    lens: torch.Tensor  # [decodes] int32: context tokens, the decode token included

    @classmethod
    def of(cls, decodes: list[tuple[int, list[int], int]], device: torch.device) -> DecodeTables:
        """From (row, block table, context tokens) per decode token."""
        width = max(len(table) for _, table, _ in decodes)
        tables = [table + [0] * (width - len(table)) for _, table, _ in decodes]
        return cls(
            torch.tensor([row for row, _, _ in decodes], dtype=torch.long, device=device),
            torch.tensor(tables, dtype=torch.int32, device=device),
            torch.tensor([tokens for _, _, tokens in decodes], dtype=torch.int32, device=device),
        )


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
    gathered: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [tokens, heads, D], the new k, v [tokens, kv_heads, D] (already in the pool) ->
    attention output [tokens, heads, D], each sequence over its own context, except the
    rows of slices marked `kernel`, `far` or `in_place` (left for the decode kernel,
    far_kv.py, prefix_in_place.py).
    `gathered`: the blocks of the other slices whose blocks are None, in their order (one
    copy per layer)."""
    out = torch.empty_like(q)
    if gathered is not None:
        gathered_k, gathered_v = kv.gather(layer, gathered)  # [kv_heads, blocks * B, D]
    for part in slices:
        if part.kernel or part.far or part.in_place:
            continue
        query = q[part.rows].transpose(0, 1).unsqueeze(0)  # [1, heads, new, D]
        if part.self_contained and (window is None or part.new_tokens <= window):
            keys, values = k[part.rows].transpose(0, 1), v[part.rows].transpose(0, 1)  # [kv_heads, new, D]
            mask, causal = None, part.new_tokens > 1
        else:
            if part.blocks is not None:
                keys, values = kv.context(layer, part.blocks, part.context_tokens)  # [kv_heads, context, D]
            else:
                rows = slice(part.gathered_at, part.gathered_at + part.context_tokens)
                keys, values = gathered_k[:, rows], gathered_v[:, rows]  # [kv_heads, context, D]
            if part.unmasked_split(window, q.device):
                own = (k[part.rows].transpose(0, 1), v[part.rows].transpose(0, 1))  # [kv_heads, new, D]
                earlier = (keys[:, : part.start], values[:, : part.start])
                out[part.rows] = prefix_then_chunk(query, earlier, own, scale)[0].transpose(0, 1)
                continue
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
