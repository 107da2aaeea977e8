"""A prompt module's KV, and encoding it: one forward pass over the module's tokens at the
positions its schema gives them, after the text that always precedes it (its context: the
text of its ancestors before it, the root's included), copied out of the pool.

Positions may have gaps inside a module (a parameter reserves positions whose tokens are
the arguments, computed when a prompt is served).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import blake3
import torch

from attnstore.chunks.keys import NAMESPACE_BYTES
from inference_worker.engine.engine import Engine
from inference_worker.engine.sequence import Sequence as EngineSequence
from inference_worker.kv_saver import KV
from inference_worker.layerwise_cache import PrefixKV

_LAYOUT_DOMAIN = b"attnstore/module-layout/v1\0"


class LayerFeed(Sequence[tuple[torch.Tensor, torch.Tensor]]):
    """A stored module's KV as the daemon's read delivers it, layer by layer (layer-wise
    loading: a prompt's first layers are computed while its modules' later layers are still
    being read). The reader (a task on the event loop) puts each layer; indexing a layer
    waits for it, so only other threads index it (the engine's, a selection's `to_thread`).
    Indexing raises PrefixLoadFailed when the read failed or a layer is late."""

    def __init__(self, num_layers: int, tokens: int, timeout_seconds: float) -> None:
        self._layers = PrefixKV(num_layers, tokens)
        self.timeout_seconds = timeout_seconds  # the longest wait for one layer

    def put(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """K, V [kv_heads, tokens, head_dim] of `layer`. Raises ValueError for another shape."""
        self._layers.put_layer(layer, k, v)

    def put_all(self, kv: KV) -> None:
        """Every layer at once (a module kept in the worker's memory: module_cache.py)."""
        for layer, (k, v) in enumerate(kv):
            self.put(layer, k, v)

    def fail(self, exc: BaseException) -> None:
        self._layers.fail(exc)

    def __len__(self) -> int:
        return self._layers.num_layers

    def __getitem__(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """Layer `layer`'s K, V (negative: from the last); layers only, no slices."""
        if not -len(self) <= layer < len(self):
            raise IndexError(f"layer {layer} of a module KV of {len(self)} layers")
        return self.wait(layer % len(self), self.timeout_seconds)

    def wait(self, layer: int, timeout_seconds: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s K, V, waiting at most `timeout_seconds` (the forward pass's own bound)."""
        return self._layers.wait_layer(layer, timeout_seconds)


@dataclass(frozen=True)
class ModuleKV:
    """The KV of one module: per layer K, V [kv_heads, tokens, head_dim], keys rotated for
    `positions` (increasing; the first is the module's base position); a LayerFeed while
    it is being read from the store."""

    token_ids: tuple[int, ...]
    positions: tuple[int, ...]
    kv: KV

    def __post_init__(self) -> None:
        if not self.token_ids or len(self.token_ids) != len(self.positions):
            raise ValueError(
                f"a module needs tokens, one position each ({len(self.token_ids)}, {len(self.positions)})"
            )
        if any(b <= a for a, b in zip(self.positions, self.positions[1:], strict=False)):
            raise ValueError("a module's positions must increase")
        # A LayerFeed checks each layer's shape as it arrives.
        if not isinstance(self.kv, LayerFeed) and any(k.shape[1] != len(self.token_ids) for k, _ in self.kv):
            raise ValueError(f"the module's KV does not hold its {len(self.token_ids)} tokens")

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def base_position(self) -> int:
        return self.positions[0]


def layout_namespace(namespace: bytes, positions: Sequence[int], cached_tokens: int) -> bytes:
    """The pool namespace of a sequence laid out with explicit `positions` whose first
    `cached_tokens` come from module KV: its blocks are shared only with sequences of the
    same layout (the same tokens at other positions, or computed with another context,
    have other KV)."""
    hasher = blake3.blake3(_LAYOUT_DOMAIN)
    hasher.update(namespace)
    hasher.update(struct.pack(f"<I{len(positions)}I", cached_tokens, *positions))
    return hasher.digest(NAMESPACE_BYTES)


async def encode_module(
    engine: Engine,
    token_ids: Sequence[int],
    positions: Sequence[int],
    namespace: bytes,
    context: tuple[Sequence[int], Sequence[int]] = ((), ()),
) -> ModuleKV:
    """The module's KV computed at `positions` (batched with the engine's other work),
    attending to its own earlier tokens and to `context` (tokens, positions: text that every
    prompt importing the module serves before it), whose KV is not kept."""
    context_ids, context_positions = list(context[0]), list(context[1])
    tokens, places = list(token_ids), list(positions)
    seq = EngineSequence.of(
        context_ids + tokens,
        layout_namespace(namespace, context_positions + places, 0),
        positions=context_positions + places,
    )
    try:
        async for _ in engine.generate(seq):  # max_new_tokens 0: prefill only
            pass
        kv = await asyncio.to_thread(engine.kv.span, seq.block_table, len(context_ids), len(seq))
    finally:
        engine.release(seq)
    return ModuleKV(tuple(tokens), tuple(places), kv)
