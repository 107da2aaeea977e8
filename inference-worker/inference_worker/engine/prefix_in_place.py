"""Stored prefix KV attended where the read put it, copied into the pool's blocks later.

A prompt served from module KV loads the modules' KV into its first blocks during its first
forward pass. Written there layer by layer before its computed tokens attend, that copy sat
on the TTFT path: 89-92 ms of a 4,096-token module's turn (188 MB, SmolLM2, fp32, CPU). When
every computed token of the step comes after every loaded one, the step's queries see the
whole prefix, so they attend over the read's tensors as they are: a prefix of module spans
(`SpanPrefix`) in one call of the prefill kernel over every span where its read left it and
the rows' own K and V (`PagedPrefillKernel.spans`: a span served at another position than
encoded has its queries rotated back, not its keys rotated); else (no kernel, another
prefix) one unmasked flash call over the prefix joined, and one over their own keys
causally, merged by log-sum-exp (chunk_attention.py). The prefix is copied into its blocks
(joined, keys re-positioned) after the step's tokens are out (`DeferredWrites`), before
anything reads those blocks: the engine's next step, or `PagedKV.span` from another thread.

    step N:    forward (prefix attended in place) -> sample -> outputs to their owners
               -> DeferredWrites.add (the prefix's slots and tensors, every layer)
    step N+1:  releases (a released sequence's writes are dropped: nobody reads its blocks
               unless the pool keeps freed prefixes) -> flush -> schedule -> forward
    any time:  PagedKV.span flushes first (an owner reading a finished sequence's KV)

Only prompt-module sequences take this path (explicit positions, no far KV, the whole
prefix loaded: no pool prefix hit), on a CPU (the flash kernel that returns log-sum-exps).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from inference_worker.engine.chunk_attention import prefix_then_chunk
from inference_worker.engine.prefill_kernel import KeySpan, PagedPrefillKernel
from inference_worker.engine.sequence import Sequence as EngineSequence
from inference_worker.layerwise_cache import PrefixKV

LayerKV = tuple[torch.Tensor, torch.Tensor]  # K, V [kv_heads, tokens, D]
Writer = Callable[[int, torch.Tensor | slice, torch.Tensor, torch.Tensor], None]  # PagedKV.write


@runtime_checkable
class SpanPrefix(Protocol):
    """A prefix whose layers are runs of keys where they were read (a prompt's module spans:
    ModulePrefix), each with the rotation that re-positions its keys."""

    def spans(self, layer: int, timeout_seconds: float) -> list[KeySpan]:
        """The layer's spans in slot order, waited for as `wait_layer` waits (PrefixLoadFailed)."""
        ...


@dataclass
class InPlacePrefix:
    """A sequence of the step whose stored prefix its rows attend in place."""

    seq: EngineSequence
    prefix: PrefixKV
    rows: slice  # the sequence's computed rows in the flattened batch
    slots: torch.Tensor | slice  # the prefix's slots in the pool
    layers: list[LayerKV] = field(default_factory=list)  # each layer's prefix K, V as the pass read them
    # Attended span by span (the prefill kernel's `spans`), decided once a step: a runtime-checkable
    # Protocol's isinstance walks its members (14-20 us at load 9; per layer ~0.5 ms a module turn).
    by_spans: bool = False
    spans: list[KeySpan] = field(default_factory=list)  # the current layer's, when by spans

    def written_layers(self) -> Sequence[LayerKV]:
        """Each layer's prefix K, V [kv_heads, tokens, D] for its blocks: as the pass read them,
        or, attended by spans, joined when asked (after the step: off the first token's path)."""
        return _Joined(self.prefix) if self.by_spans else self.layers


class _Joined(Sequence[LayerKV]):
    """A span prefix's layers, each joined (keys re-positioned) when indexed."""

    def __init__(self, prefix: PrefixKV) -> None:
        self._prefix = prefix

    def __len__(self) -> int:
        return self._prefix.num_layers

    def __getitem__(self, layer: int) -> LayerKV:  # type: ignore[override]
        return self._prefix.wait_layer(layer, 0.0)  # the step waited for every layer already


def attends_in_place(
    seq: EngineSequence, start: int, stop: int, windows: Sequence[int | None], device: torch.device
) -> bool:
    """Whether tokens [start, stop) of `seq` (its first step: the prefix just loaded) can
    attend its prefix in place: every one of them sees every prefix key."""
    prefix = seq.prefix
    if (
        prefix is None
        or seq.positions is None
        or seq.far is not None
        or seq.prefix_skip
        or start != prefix.prefix_tokens
        or device.type != "cpu"
    ):
        return False
    rows = seq.positions_of(start, stop)
    loaded = seq.positions[:start]
    if any(b <= a for a, b in itertools.pairwise(rows)) or min(rows) <= max(loaded):
        return False  # interleaved (repaired module tokens): the masked path
    span = rows[-1] - min(loaded)
    return all(window is None or span < window for window in windows)


def attend_in_place(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    part: InPlacePrefix,
    scale: float,
    out: torch.Tensor,
    kernel: PagedPrefillKernel | None,
) -> None:
    """Writes the rows' attention into out[part.rows] [rows, heads, D]: over the prefix's
    current layer and their own new k, v [tokens, kv_heads, D] causally. A span prefix is one
    call of the prefill kernel over its spans and the rows' K, V where they lie; else two
    flash calls merged (chunk_attention.py). Why: for a 3-document prompt (873 module keys,
    one layer, one thread, load 10) the kernel over the spans joined took 0.38 / 0.76-0.88 ms
    for 14 / 32 rows against flash's 0.61-0.64 / 1.26-1.33; attended where they lie, the
    spans need no join (a copy with keys rotated, 120 a turn) before the first token."""
    if part.by_spans:
        assert kernel is not None  # `by_spans` only with the kernel
        own = (k[part.rows].transpose(0, 1), v[part.rows].transpose(0, 1), None)  # [kv_heads, rows, D]
        kernel.spans(q, out, part.rows, [*part.spans, own], scale=scale)
        return
    earlier_k, earlier_v = part.layers[-1]
    query = q[part.rows].transpose(0, 1).unsqueeze(0)  # [1, heads, rows, D]
    own = (k[part.rows].transpose(0, 1), v[part.rows].transpose(0, 1))  # [kv_heads, rows, D]
    earlier = (earlier_k.to(q.dtype), earlier_v.to(q.dtype))  # a store read in another dtype
    out[part.rows] = prefix_then_chunk(query, earlier, own, scale)[0].transpose(0, 1)


class DeferredWrites:
    """Prefix KV waiting to be copied into its sequence's blocks, per sequence id. Thread-safe:
    the engine's thread flushes before each step, a reader's thread before it reads."""

    def __init__(self, write: Writer) -> None:
        self._write = write
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[torch.Tensor | slice, Sequence[LayerKV]]] = {}

    def add(self, part: InPlacePrefix) -> None:
        with self._lock:
            self._pending[part.seq.seq_id] = (part.slots, part.written_layers())

    def discard(self, seq_id: int) -> None:
        """Drops a released sequence's writes: its blocks are freed unread."""
        with self._lock:
            self._pending.pop(seq_id, None)

    def flush(self) -> None:
        """Copies every pending prefix into its blocks (held under the lock: a second caller
        waits until the blocks hold it)."""
        with self._lock:
            for slots, layers in self._pending.values():
                for layer, (k, v) in enumerate(layers):
                    self._write(layer, slots, k.transpose(0, 1), v.transpose(0, 1))
            self._pending.clear()
