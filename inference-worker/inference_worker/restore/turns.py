"""Hidden states in turns: what a worker whose storage plan is not all KV adds to its
turns (turn_engine.py, prefill.py, kv_saver.py). Built only then (`for_worker`): on the
default path (grouped-query models, or `hidden_states = off`) there is none and turns store
and load KV exactly as before.

    turn 1   watch(seq) ──forward──> HiddenCapture ──take──> CapturedHidden
             ──ChunkRun(restore=RestoreForm)──> ChunkSaver ──encode_restore_chunks──> daemon
    turn 2   lookup hit ──start(plan = policy.plan(tier, tokens))──> restore_prefix ──> PrefixKV

Decisions:
- Truncated turns restore too: chunk 0's first S tokens (the sinks), then the kept chunks
  at their kept positions. Hidden states carry no rotation, so projecting them there is
  exact; KV layers are rotated as the KV loader does; recomputed first layers run over the
  kept tokens. Under the same truncation as the turn that saved the chunks, that is what
  recomputing the kept tokens gives; after a further truncation, recomputed layers see the
  new context while stored ones keep the one they were computed in (as re-positioned KV
  does). A missing sinks chunk is computed whole and saved in the storage plan's forms.
- A preempted sequence's snapshot is saved as restore chunks (the chunks it computed whole,
  with the hidden states captured so far) and restored from position 0 when it resumes.
- Partial last chunks (tails) are saved and read as on the KV path. The turn reading one
  completes its chunk, whose first tokens it did not compute: the restore keeps the tail's
  hidden states of the HIDDEN layers (read, or the inputs of recomputed ones) and `seed`s
  the capture with them, so that chunk is saved whole. A tail whose first tokens the
  capture lacks anyway is not saved (the next turn recomputes it).
- A turn saves only the chunks whose every token it computed or was seeded with: chunks
  whose KV came from the pool or the store are not saved again.
- The pool's cached chunks are not skipped in the lookup (restore starts at position 0),
  and every chunk is read through the own daemon (which fetches those placed on pool peers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from attnstore.kvstore_client import AsyncKVStoreClient, Tier
from inference_worker.engine.model_runner import PagedModelRunner
from inference_worker.engine.sequence import Sequence as EngineSequence
from inference_worker.layerwise_cache import PrefixKV
from inference_worker.model_geometry import ModelGeometry
from inference_worker.restore.capture import HiddenCapture
from inference_worker.restore.codec import HiddenLayers
from inference_worker.restore.loader import RestoreStats, restore_prefix
from inference_worker.restore.metrics import observe_restore, observe_saved
from inference_worker.restore.planner import RestorePlan
from inference_worker.restore.policy import RestorePolicy
from inference_worker.restore.storage_plan import StoragePlan
from inference_worker.rotary_shift import RotaryShift


@dataclass(frozen=True)
class RestoreForm:
    """How a ChunkRun is encoded when its namespace stores restore chunks."""

    storage: StoragePlan
    geometry: ModelGeometry
    hidden: HiddenLayers  # per layer [tokens, hidden] of the run's tokens; None where not HIDDEN

    def observe_saved(self, tokens: int, element_bytes: int) -> None:
        """Counts the bytes `tokens` tokens saved in this form against their KV (metrics)."""
        width = next((states.shape[-1] for states in self.hidden if states is not None), 0)
        kv = StoragePlan.all_kv(self.storage.num_layers).bytes_per_token(self.geometry, width, element_bytes)
        observe_saved(kv * tokens, self.storage.bytes_per_token(self.geometry, width, element_bytes) * tokens)


@dataclass(frozen=True)
class CapturedHidden:
    """A sequence's captured layer inputs: per layer [tokens, hidden] from position `first`."""

    first: int
    layers: list[torch.Tensor]

    def span(self, start: int, stop: int) -> list[torch.Tensor]:
        return [layer[start - self.first : stop - self.first] for layer in self.layers]


class TurnRestore:
    def __init__(self, policy: RestorePolicy, runner: PagedModelRunner, shift: RotaryShift | None) -> None:
        self.policy, self.storage, self.shift = policy, policy.storage, shift
        self.model, self.geometry = runner.model, runner.geometry
        self._capture = HiddenCapture(runner) if policy.storage.hidden_layers else None
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="restore")  # recomputation, projections

    def watch(self, seq: EngineSequence) -> None:
        if self._capture is not None:
            self._capture.watch(seq)

    def take(self, seq: EngineSequence, *, keep_watching: bool = False) -> CapturedHidden:
        """What `seq` computed while watched (a plan without HIDDEN layers needs nothing: every
        chunk can be saved); `keep_watching`: a preempted sequence's, which runs on."""
        if self._capture is None:
            return CapturedHidden(0, [])
        first, layers = (self._capture.peek if keep_watching else self._capture.take)(seq)
        return CapturedHidden(first, layers)

    def seed(self, seq: EngineSequence, stats: RestoreStats) -> None:
        """Hands a restored partial chunk's hidden states to `seq`'s capture, so the chunk it
        completes is saved whole (`restore_prefix`'s `tail_tokens`)."""
        if self._capture is not None and stats.tail_hidden:
            tail = next(iter(stats.tail_hidden.values())).shape[0]
            self._capture.seed(seq, stats.tokens - tail, stats.tail_hidden)

    def forget(self, seq: EngineSequence) -> None:
        if self._capture is not None:
            self._capture.forget(seq)

    def form(self, captured: CapturedHidden, start: int, stop: int) -> RestoreForm:
        hidden: HiddenLayers = (
            captured.span(start, stop) if captured.layers else [None] * self.storage.num_layers
        )
        return RestoreForm(self.storage, self.geometry, hidden)

    def plan(self, tiers: Sequence[Tier], tokens: int) -> RestorePlan:
        """The planner's plan for a prefix read from `tiers` (SSD if any chunk is there)."""
        return self.policy.plan("ssd" if Tier.SSD in tiers else "dram", tokens)

    async def restore(
        self,
        client: AsyncKVStoreClient,
        namespace: bytes,
        keys: Sequence[bytes],
        prefix: PrefixKV,
        plan: RestorePlan,
        token_ids: Sequence[int],
        head_tokens: int | None = None,
        tail_tokens: int = 0,
    ) -> RestoreStats:
        """`token_ids`: the kept tokens, from position 0; `head_tokens`, `tail_tokens`:
        restore_prefix's."""
        return await restore_prefix(
            client,
            namespace,
            keys,
            prefix,
            model=self.model,
            storage=self.storage,
            plan=plan,
            token_ids=token_ids,
            compute=self._compute,
            shift=self.shift,
            head_tokens=head_tokens,
            tail_tokens=tail_tokens,
        )

    def settled(self, loader: asyncio.Task[Any]) -> RestoreStats | None:
        """A turn's or a resume's load task, done: a restore's stats once it ran to its end,
        counted in the metrics and the costs of the next plans; None for one cancelled
        first or a KV load."""
        if not loader.done() or loader.cancelled() or loader.exception() is not None:
            return None
        stats = loader.result()
        if not isinstance(stats, RestoreStats):
            return None
        observe_restore(stats)
        self.policy.observe(stats)
        return stats

    def close(self) -> None:
        self._compute.shutdown(wait=False, cancel_futures=True)
