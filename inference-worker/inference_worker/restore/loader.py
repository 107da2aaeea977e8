"""Restoring a stored prefix under a restore plan: the producer side of `PrefixKV`, like
prefix_loader.load_prefix for KV chunks, so the paged forward takes each layer when it
reaches it and writes it into the sequence's pool blocks.

    compute thread   recompute layers [0, r) ──put──>  | project HIDDEN layer l chunk 0, 1, .. ──put──> ...
    event loop       read layers [r, L) layer-major: HIDDEN chunk ──> compute queue
                                                     KV row ──> re-position ──put──>

One compute thread (a one-worker executor) runs the recomputation first, then the
projections in layer order, each chunk's as soon as its piece arrives, while the loop
keeps reading: IO and compute overlap as the planner modelled. Projecting chunk by chunk
rather than a layer at a time shortens the pipeline's fill (the compute waits for one
chunk's read, not a layer's) and its drain (one chunk's projection after the last read, not
a layer's): a timeline of a 1,024-token, 12-layer restore at 0.1 GB/s (load 9) had 31 ms of
reads before the first projection and 57 ms of projection after the last read, 16% of its
567 ms (restore/timeline.py). Layers below the plan's recompute count are not read at all.
Any failure fails the prefix (never raises), so the forward pass recomputes, as for KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from attnstore.chunks.format import LayerForm
from attnstore.kvstore_client import AsyncKVStoreClient, DaemonProtocolError, LayerPiece
from inference_worker.device_copies import CopyStream
from inference_worker.engine.model_runner import rotary_of
from inference_worker.kv_codec import KVShapeError
from inference_worker.layerwise_cache import PrefixKV, PrefixLoadFailed
from inference_worker.prefix_loader import assemble_layer
from inference_worker.restore.codec import hidden_from_pieces
from inference_worker.restore.hidden_states import project_kv, recompute_layers
from inference_worker.restore.planner import RestorePlan
from inference_worker.restore.storage_plan import StoragePlan
from inference_worker.restore.timeline import Timeline
from inference_worker.rotary_shift import RotaryShift


@dataclass
class RestoreStats:
    """What one restore did and cost (seconds by method: compute time for recompute and
    hidden, read time of the KV layers' rows for kv)."""

    plan: RestorePlan
    tokens: int  # the prefix's
    bytes_read: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {"recompute": 0.0, "hidden": 0.0, "kv": 0.0})
    timeline: Timeline = field(default_factory=Timeline)  # per layer: reads vs compute
    # per HIDDEN layer, the input hidden states [tail tokens, hidden] of a partial last chunk
    tail_hidden: dict[int, torch.Tensor] = field(default_factory=dict)


async def restore_prefix(
    client: AsyncKVStoreClient,
    namespace: bytes,
    keys: Sequence[bytes],
    prefix: PrefixKV,
    *,
    model: PreTrainedModel,
    storage: StoragePlan,
    plan: RestorePlan,
    token_ids: Sequence[int],
    compute: Executor,
    shift: RotaryShift | None = None,
    head_tokens: int | None = None,
    tail_tokens: int = 0,
) -> RestoreStats:
    """Fills `prefix` (its tokens: `token_ids[:prefix.prefix_tokens]`, at positions 0..)
    from the restore chunks `keys` stored under `storage`, as `plan` says; fails it on any
    error. `compute`: a one-worker executor. `shift`: re-positions KV layers of chunks
    stored at other positions (None: an error); hidden states are projected where the
    tokens sit, so they never need it. `head_tokens`: only the first so many tokens of
    chunk 0 (a truncated turn's attention sinks; None: all of it), the other chunks after
    them. `tail_tokens`: the last chunk is a partial one of that many tokens, whose hidden
    states of the HIDDEN layers (read or recomputed) go to `RestoreStats.tail_hidden`: the
    turn that computes the rest of that chunk saves it whole with them."""
    restore = _Restore(model, prefix, storage, plan, token_ids, compute, shift, head_tokens, tail_tokens)
    try:
        if plan.recompute_layers:
            restore.submit("recompute", 0, restore.recompute)
        if plan.recompute_layers < storage.num_layers:
            async with contextlib.aclosing(
                client.iter_layers(namespace, keys, layer_start=plan.recompute_layers)
            ) as pieces:
                await restore.read(pieces, len(keys))
        await asyncio.gather(*restore.computing)
    except asyncio.CancelledError:
        prefix.fail(PrefixLoadFailed("restore cancelled"))
        raise
    except Exception as exc:  # noqa: BLE001 -- any cache failure means recompute, never a failed turn
        prefix.fail(exc)
    return restore.stats


LayerKV = tuple[int, tuple[torch.Tensor, torch.Tensor]]  # layer, (K, V [kv_heads, tokens, head_dim])
_COMPUTE_PART = {"recompute": "recompute", "hidden": "project"}  # method -> its Timeline part


class _Restore:
    """One restore's state: what it reads, what its compute thread has queued."""

    def __init__(
        self,
        model: PreTrainedModel,
        prefix: PrefixKV,
        storage: StoragePlan,
        plan: RestorePlan,
        token_ids: Sequence[int],
        compute: Executor,
        shift: RotaryShift | None,
        head_tokens: int | None,
        tail_tokens: int,
    ) -> None:
        self.model, self.prefix, self.storage, self.plan = model, prefix, storage, plan
        self.compute, self.shift = compute, shift
        self.head_tokens, self.tail_tokens = head_tokens, tail_tokens
        self.stats = RestoreStats(plan, prefix.prefix_tokens)
        self.computing: list[asyncio.Future[None]] = []
        self.device = next(model.parameters()).device
        self.copies = CopyStream(self.device)  # reads beside the compute thread's kernels
        tokens = prefix.prefix_tokens
        self.ids = torch.tensor(list(token_ids[:tokens]), dtype=torch.long, device=self.device)
        self.positions = torch.arange(tokens, device=self.device)
        probe = torch.empty(0, device=self.device, dtype=next(model.parameters()).dtype)
        self.cos_sin = rotary_of(model.model, probe, self.positions)  # one rotation for every projected layer
        self.projected = (probe, probe)  # K, V [kv_heads, tokens, head_dim] of the layer being projected

    def submit(self, method: str, layer: int, work: Callable[[], list[LayerKV]]) -> None:
        """Queues `work` (from `layer` on) on the compute thread; its layers go to the
        prefix when done."""
        self.computing.append(
            asyncio.get_running_loop().run_in_executor(self.compute, self._run, method, layer, work)
        )

    def _run(self, method: str, first_layer: int, work: Callable[[], list[LayerKV]]) -> None:
        started = time.perf_counter()
        for layer, (k, v) in work():
            self.prefix.put_layer(layer, k.contiguous(), v.contiguous())
        ended = time.perf_counter()
        self.stats.seconds[method] += ended - started
        self.stats.timeline.add(_COMPUTE_PART[method], first_layer, started, ended)

    def recompute(self) -> list[LayerKV]:
        kv, _ = recompute_layers(
            self.model, self.ids, self.positions, self.plan.recompute_layers, self.keep_tail
        )
        return list(enumerate(kv))

    def keep_tail(self, layer: int, states: torch.Tensor) -> None:
        """Keeps the tail's rows of `states` [tokens, hidden], a HIDDEN layer's input."""
        if self.tail_tokens and self.storage.forms[layer] is LayerForm.HIDDEN:
            self.stats.tail_hidden[layer] = states[-self.tail_tokens :].clone()

    def project(self, layer: int, start: int, states: torch.Tensor) -> list[LayerKV]:
        """K and V of one chunk's tokens [start, start + n) of `layer` from its hidden states
        [n, hidden], into the layer's K and V; the layer once its last chunk is in (the one
        compute thread takes a layer's chunks in order, one layer after another)."""
        stop = start + states.shape[0]
        cos, sin = self.cos_sin
        k, v = project_kv(
            self.model, layer, states, self.positions[start:stop], (cos[start:stop], sin[start:stop])
        )
        if start == 0:
            shape = (k.shape[0], self.prefix.prefix_tokens, k.shape[2])  # [kv_heads, tokens, head_dim]
            self.projected = (k.new_empty(shape), v.new_empty(shape))
        layer_k, layer_v = self.projected
        layer_k[:, start:stop], layer_v[:, start:stop] = k, v
        return [(layer, self.projected)] if stop == self.prefix.prefix_tokens else []

    def hidden_chunk(self, piece: LayerPiece, used: int) -> tuple[torch.Tensor]:
        """The input hidden states [used tokens, hidden] of one chunk of a HIDDEN layer."""
        return (hidden_from_pieces([piece], self.device)[:used],)

    def kv_layer(self, row: Sequence[LayerPiece]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [kv_heads, prefix tokens, head_dim] of a KV layer from its pieces `row`."""
        chunk_tokens = row[0].layout.header.tokens  # chunk 0 is whole (or the only one)
        head = self.used_tokens(row[0])
        return assemble_layer(row, self.device, chunk_tokens, head, self.shift, 0, restore_chunks=True)

    def used_tokens(self, piece: LayerPiece) -> int:
        """The tokens of `piece`'s chunk that the prefix takes: chunk 0's head, others whole."""
        tokens = piece.layout.header.tokens
        return min(tokens, self.head_tokens) if piece.chunk_index == 0 and self.head_tokens else tokens

    async def read(self, pieces: AsyncIterator[LayerPiece], chunks: int) -> None:
        """Takes layers [recompute_layers, L) of `chunks` chunks, layer-major."""
        row: list[LayerPiece] = []
        layer = self.plan.recompute_layers
        row_tokens = 0  # the row's pieces' so far
        started = time.perf_counter()
        async for piece in pieces:
            if piece.chunk_index != len(row) or piece.layer != layer:
                raise DaemonProtocolError(
                    f"got layer {piece.layer} of chunk {piece.chunk_index} out of order"
                )
            if (
                piece.layout.header.layer_forms or (LayerForm.KV,) * self.storage.num_layers
            ) != self.storage.forms:
                raise KVShapeError(f"chunk {piece.chunk_index} was not stored under plan {self.storage.name}")
            row.append(piece)
            self.stats.bytes_read += len(piece.data)
            used = self.used_tokens(piece)
            if self.storage.forms[layer] is LayerForm.HIDDEN:  # projected chunk by chunk (module docstring)
                (states,) = self.copies.run(functools.partial(self.hidden_chunk, piece, used))
                if piece.chunk_index == chunks - 1:
                    self.keep_tail(layer, states)
                self.submit("hidden", layer, functools.partial(self.project, layer, row_tokens, states))
            row_tokens += used
            if len(row) < chunks:
                continue
            arrived = time.perf_counter()
            self.stats.timeline.add("read", layer, started, arrived)
            if row_tokens != self.prefix.prefix_tokens:
                raise KVShapeError(f"layer {layer}: {row_tokens} tokens read for {self.prefix.prefix_tokens}")
            if self.storage.forms[layer] is not LayerForm.HIDDEN:
                k, v = self.copies.run(functools.partial(self.kv_layer, row))
                self.prefix.put_layer(layer, k, v)
            decoded = time.perf_counter()
            self.stats.timeline.add("decode", layer, arrived, decoded)
            if self.storage.forms[layer] is not LayerForm.HIDDEN:
                self.stats.seconds["kv"] += decoded - started
            started = decoded
            row, layer, row_tokens = [], layer + 1, 0
        if layer != self.storage.num_layers:
            raise DaemonProtocolError(f"the read ended after layer {layer} of {self.storage.num_layers}")
