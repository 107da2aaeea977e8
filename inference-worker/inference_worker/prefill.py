"""Prefill: a prompt's sequence handed to the engine with its stored prefix. The stored chunks
found for it load layer by layer in the background, straight into the sequence's pool
blocks during its first forward pass, while the rest of the kept prompt is computed on top
of them; any cache failure recomputes instead, so the cache never fails a turn.

    prompt ──chunk keys──> Lookup ──hit──> load_prefix (event loop) ──PrefixKV──┐
                                                                  layer l, into blocks
    Sequence(kept tokens, prefix) ──Engine (batched with other turns)──> first token

Decisions:
- The reusable chunks are `Truncation.reusable_chunks`: every whole chunk before the one
  holding the last prompt token, or after a truncation chunk 0 (for its sinks) then the
  kept ones. The reused prefix is the longest run of stored chunks from the start of that
  list. So a truncated turn whose chunk 0 is missing reuses nothing, even where later
  chunks are stored: its sinks would have to be computed in front of KV loaded behind
  them. It reports `sink_chunk_missing` and the engine saves chunk 0 after the turn
  (a truncated session never computes chunk 0 whole otherwise, so one whose first turn
  overflowed, or whose chunk 0 was evicted, would never reuse again).
- Fallbacks: a lookup that fails or times out is DAEMON_UNAVAILABLE; a layer that misses
  its deadline is DEADLINE; a corrupt, malformed or vanished chunk is CHUNK_INVALID, and
  the hit chunks are then deleted before the turn's save puts them again (a put alone
  would keep a corrupt chunk as "already stored"). The engine drops the failed prefix and
  recomputes those tokens in a later step; the other sequences of the batch only lose
  that step.
- With `pool_keeps_freed_prefixes` the pool is the first cache level: before the lookup,
  the prompt's leading whole chunks whose blocks the pool holds (computed by a live
  sequence or kept after a finished one) are counted, and the daemon is asked only for
  the chunks after them (lookup and read). The pool is read from the event loop while
  the engine's thread may change it; a block it lets go of before the sequence is
  admitted is recomputed (with the loaded KV after it), never read stale. Without the
  setting the pool forgets a block as soon as its last sequence is released, which
  happens between a turn and the next one of its session all the time, so the daemon
  is then asked for the whole prefix (the pool's blocks still come first when they are
  there at admission). Only untruncated turns skip chunks: after a truncation the
  pool's keys (over the kept tokens) and the daemon's (over the original ones) differ.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog
import torch

from attnstore.chunks.keys import chunk_key, chunk_key_chain
from attnstore.kvstore_client import AsyncKVStoreClient, Tier
from inference_worker.engine.engine import Engine
from inference_worker.engine.sequence import Sequence as EngineSequence
from inference_worker.kv_saver import KV, ChunkRun, ChunkSaver
from inference_worker.layerwise_cache import PrefixKV
from inference_worker.namespaces import Namespaces
from inference_worker.prefix_loader import classify_failure, load_prefix
from inference_worker.restore.loader import RestoreStats
from inference_worker.restore.planner import RestorePlan
from inference_worker.restore.turns import CapturedHidden, TurnRestore
from inference_worker.rotary_shift import RotaryShift
from inference_worker.truncation import NO_TRUNCATION, Truncation
from inference_worker.turn_types import Fallback, KVSource

log = structlog.get_logger("inference_worker.prefill")


@dataclass
class Prefill:
    """How a prompt's KV was obtained (and, from `Prefiller.prefill`, its logits and KV)."""

    truncation: Truncation
    prompt_keys: list[bytes] = field(default_factory=list)  # chain keys of its full chunks (no source: none)
    reused_tokens: int = 0
    reused_dram_chunks: int = 0
    reused_ssd_chunks: int = 0
    kv_load_seconds: float = 0.0
    kv_load_exposed_seconds: float = 0.0
    compute_seconds: float = 0.0  # submission to the last prompt token's logits, waits for KV excluded
    fallback: Fallback | None = None
    save_from_chunk: int = 0  # original index: the chunks before it are stored (reused) or dropped
    replace_keys: tuple[bytes, ...] = ()  # stored chunks that failed to load: replaced when saving
    stale_keys: tuple[bytes, ...] = ()  # the history's partial chunk it loaded: deleted when saving
    sink_chunk_missing: bool = False  # truncated with sinks, and chunk 0 is known not to be stored
    restore_plan: str = ""  # RestorePlan.name of a prefix restored from restore chunks
    restore_seconds: dict[str, float] = field(default_factory=dict)  # RestoreStats.seconds of it
    logits: torch.Tensor | None = None  # [vocab] fp32 of the last prompt token (Prefiller.prefill)
    kv: KV | None = None  # per layer K, V of every kept prompt token (Prefiller.prefill)
    hidden: CapturedHidden | None = None  # ... and its layer inputs, on a hidden-state worker


@dataclass
class PendingPrefill:
    """A prompt's sequence, ready for the engine, and what its lookup found."""

    seq: EngineSequence
    truncation: Truncation
    keys: list[bytes]
    source: KVSource | None
    hit: _Hit | None
    fallback: Fallback | None  # of the lookup
    prefix: PrefixKV | None  # the hit's KV, loading
    loader: asyncio.Task[object] | None
    # perf_counter() once the lookup is done and the load started: compute is timed from here,
    # so a slow lookup (a loaded daemon) shows in TTFT - compute - exposed wait, not in compute
    submitted: float
    restore_plan: RestorePlan | None = None  # the hit is restored from restore chunks so


@dataclass(frozen=True)
class _Hit:
    """What the lookup found: a run of `Truncation.reusable_chunks`, possibly empty, and
    possibly the partial chunk that ends the session's history right after them."""

    chunks: list[int]  # original indices of the full chunks to load, in kept order
    keys: list[bytes]  # the full chunks' keys, then the partial chunk's
    tiers: list[Tier]
    places: list[str]  # per chunk: the pool peer to read it from, "" for the own daemon
    tail_tokens: int = 0  # tokens of the partial chunk (0: none)
    start_tokens: int = 0  # prompt tokens before the hit: the pool holds them


@dataclass(frozen=True)
class _Tail:
    """The partial chunk a previous turn saved at the end of the history: after `full_chunks`
    full chunks, `tokens` tokens, under `key`."""

    full_chunks: int
    tokens: int
    key: bytes


def history_tail(
    prompt: Sequence[int], keys: Sequence[bytes], history_tokens: int, namespace: bytes, chunk_tokens: int
) -> _Tail | None:
    """Where the previous turn's partial chunk ends: it saved the KV of its prompt and all
    generated tokens but the last (never fed back), so of `history_tokens - 1` tokens."""
    full_chunks, tokens = divmod(history_tokens - 1, chunk_tokens)
    if history_tokens < 2 or tokens == 0 or full_chunks > len(keys):
        return None
    start = full_chunks * chunk_tokens
    parent = keys[full_chunks - 1] if full_chunks else None
    return _Tail(full_chunks, tokens, chunk_key(namespace, parent, prompt[start : start + tokens]))


class Prefiller:
    def __init__(
        self,
        engine: Engine,
        kvstore: AsyncKVStoreClient | None,
        namespaces: Namespaces,
        shift: RotaryShift | None,
        *,
        layer_timeout_seconds: float,
        lookup_timeout_seconds: float,
        saver: ChunkSaver | None = None,
        fetch_from_peers: bool = True,
        restore: TurnRestore | None = None,
    ) -> None:
        """`saver`: this worker's background saves, waited for (up to the layer timeout)
        when they hold chunks a prompt wants. `fetch_from_peers`: read chunks on pool peers
        from the peers (WorkerSettings.fetch_from_peers). `restore`: the namespaces hold
        restore chunks, read with the planner's plan (restore/turns.py)."""
        self.fetch_from_peers = fetch_from_peers
        self.restore = restore
        self.engine = engine
        self.saver = saver
        self.kvstore = kvstore
        self.namespaces = namespaces
        self.shift = shift
        self.layer_timeout_seconds = layer_timeout_seconds
        self.lookup_timeout_seconds = lookup_timeout_seconds
        self.resumed_from_store = 0  # preempted sequences that came back by loading their KV

    async def start(
        self,
        prompt_token_ids: Sequence[int],
        source: KVSource | None,
        truncation: Truncation = NO_TRUNCATION,
        history_tokens: int = 0,
    ) -> PendingPrefill:
        """Looks the prompt up and starts loading its stored prefix; the sequence of
        `truncation.kept(prompt)` that the caller submits to the engine (after setting
        its sampling). `history_tokens`: where the session's history ends (TurnInput)."""
        prompt = list(prompt_token_ids)
        keys = chunk_key_chain(source.namespace, prompt, source.chunk_tokens) if source is not None else []
        seq = EngineSequence.of(truncation.kept(prompt))
        pooled = 0
        if source is not None:
            seq.namespace = source.namespace  # tenants never share blocks
            if truncation == NO_TRUNCATION and self.engine.pool.keep_freed_prefixes and self.restore is None:
                pooled = self.engine.pool.cached_tokens(seq) // source.chunk_tokens
        fallback: Fallback | None = None
        try:
            hit = await self._find_prefix(prompt, keys, source, truncation, history_tokens, pooled)
        except Exception as exc:  # noqa: BLE001 -- any lookup failure means recompute
            log.warning("lookup failed; recomputing", error=repr(exc))
            hit, fallback = None, Fallback.DAEMON_UNAVAILABLE
        prefix = loader = plan = None
        if source is not None and hit is not None and hit.keys and self.kvstore is not None:
            if self.restore is not None:
                prefix, loader, plan = self._start_restore(
                    self.restore, self.kvstore, source, hit, prompt, truncation
                )
            else:
                prefix, loader = self._start_load(self.kvstore, source, hit, truncation)
            seq.prefix = prefix
        submitted = time.perf_counter()
        return PendingPrefill(seq, truncation, keys, source, hit, fallback, prefix, loader, submitted, plan)

    def _start_restore(
        self,
        restore: TurnRestore,
        client: AsyncKVStoreClient,
        source: KVSource,
        hit: _Hit,
        prompt: list[int],
        truncation: Truncation = NO_TRUNCATION,
    ) -> tuple[PrefixKV, asyncio.Task[RestoreStats], RestorePlan]:
        """Restores the hit's chunks (from position 0) as planned: after a truncation chunk
        0's sinks, then the kept chunks at their kept positions; a history's partial last
        chunk's hidden states go to the capture when it is done (`finish`)."""
        head_tokens = truncation.sink_tokens or source.chunk_tokens  # what the first hit chunk gives
        full_tokens = head_tokens + (len(hit.chunks) - 1) * source.chunk_tokens if hit.chunks else 0
        prefix = PrefixKV(self.engine.runner.geometry.num_layers, full_tokens + hit.tail_tokens)
        plan = restore.plan(hit.tiers, prefix.prefix_tokens)
        loader = asyncio.create_task(
            restore.restore(
                client,
                source.namespace,
                hit.keys,
                prefix,
                plan,
                truncation.kept(prompt),
                head_tokens,
                hit.tail_tokens,
            )
        )
        return prefix, loader, plan

    def _start_load(
        self, client: AsyncKVStoreClient, source: KVSource, hit: _Hit, truncation: Truncation
    ) -> tuple[PrefixKV, asyncio.Task[None]]:
        chunk_tokens = source.chunk_tokens
        head_tokens = truncation.sink_tokens or chunk_tokens  # what the first hit chunk gives
        full_tokens = head_tokens + (len(hit.chunks) - 1) * chunk_tokens if hit.chunks else 0
        prefix = PrefixKV(
            self.engine.runner.geometry.num_layers,
            hit.start_tokens + full_tokens + hit.tail_tokens,
            start_tokens=hit.start_tokens,
        )
        loader = asyncio.create_task(
            load_prefix(
                client,
                source.namespace,
                hit.keys,
                prefix,
                chunk_tokens=chunk_tokens,
                head_tokens=head_tokens,
                tail_tokens=hit.tail_tokens,
                places=hit.places if self.fetch_from_peers else (),
                start_position=hit.start_tokens,
                shift=self.shift,
                device=self.engine.runner.device,
            )
        )
        return prefix, loader

    async def finish(self, pending: PendingPrefill, computed_at: float) -> Prefill:
        """What the prefill reused and cost, once the engine computed the last prompt token
        (at perf_counter() `computed_at`); ends the load if it still runs."""
        seq, hit, source, truncation = pending.seq, pending.hit, pending.source, pending.truncation
        load_seconds = 0.0
        restore_seconds: dict[str, float] = {}
        stats: RestoreStats | None = None
        if pending.loader is not None:
            pending.loader.cancel()  # done by now, unless the prefix was dropped (pool hit, failure)
            await asyncio.gather(pending.loader, return_exceptions=True)
            if self.restore is not None and (stats := self.restore.settled(pending.loader)) is not None:
                restore_seconds = dict(stats.seconds)
        prefix_tokens = 0
        fallback = pending.fallback
        failure = seq.load_failure
        if self.restore is not None and stats is not None and failure is None:
            self.restore.seed(seq, stats)  # a restored tail's hidden states: its chunk is saved whole
        if failure is not None:
            fallback = classify_failure(failure)
            load_seconds = seq.load_wait_seconds  # the failed attempt delayed the turn this long
            log.warning(
                "loading the stored prefix failed; recomputed", fallback=fallback.value, error=str(failure)
            )
        elif hit is not None and pending.prefix is not None and _written(pending.prefix, seq):
            prefix_tokens = pending.prefix.prefix_tokens
            load_seconds = pending.prefix.load_seconds or 0.0
        invalid = hit is not None and fallback is Fallback.CHUNK_INVALID
        stored = None if hit is None or invalid else hit  # still stored after a slow or failed read
        loaded = prefix_tokens > 0
        return Prefill(
            truncation=truncation,
            prompt_keys=pending.keys,
            reused_tokens=max(prefix_tokens, seq.cached_tokens),
            reused_dram_chunks=sum(tier is Tier.DRAM for tier in hit.tiers) if loaded and hit else 0,
            reused_ssd_chunks=sum(tier is Tier.SSD for tier in hit.tiers) if loaded and hit else 0,
            kv_load_seconds=load_seconds,
            kv_load_exposed_seconds=seq.load_wait_seconds,
            compute_seconds=max(computed_at - pending.submitted - seq.load_wait_seconds, 0.0),
            fallback=fallback,
            save_from_chunk=_save_from_chunk(stored, truncation, source),
            replace_keys=tuple(hit.keys) if hit is not None and invalid else (),
            stale_keys=(hit.keys[-1],) if loaded and hit is not None and hit.tail_tokens else (),
            sink_chunk_missing=truncation.sink_tokens > 0 and hit is not None and (invalid or not hit.keys),
            restore_plan=pending.restore_plan.name if pending.restore_plan is not None else "",
            restore_seconds=restore_seconds,
        )

    async def prefill(
        self,
        prompt_token_ids: Sequence[int],
        source: KVSource | None,
        truncation: Truncation = NO_TRUNCATION,
        history_tokens: int = 0,
    ) -> Prefill:
        """The prompt's prefill alone (no decoding): its stats, last-token logits and the
        KV of every kept token (copied out of the pool, whose blocks are then freed), and on
        a hidden-state worker the layer inputs it computed."""
        pending = await self.start(prompt_token_ids, source, truncation, history_tokens)
        seq = pending.seq
        logits = None
        if self.restore is not None:
            self.restore.watch(seq)
        try:
            async for output in self.engine.generate(seq):
                logits = output.logits
            prefill = await self.finish(pending, time.perf_counter())
            prefill.logits = logits
            prefill.kv = await asyncio.to_thread(self.engine.kv.span, seq.block_table, 0, len(seq))
            prefill.hidden = self.restore.take(seq) if self.restore is not None else None
        finally:
            if self.restore is not None:
                self.restore.forget(seq)
            self.engine.release(seq)
        return prefill

    async def resume(self, seq: EngineSequence, source: KVSource) -> asyncio.Task[None] | None:
        """A sequence handed back by preemption with its snapshot: saves the snapshot's
        chunks, then loads them back as the prefix its next admission writes; None (the
        engine recomputes) when the store cannot take or give them."""
        kv, seq.snapshot = seq.snapshot, None
        if kv is None or self.saver is None or self.kvstore is None:
            return None
        chunk_tokens = source.chunk_tokens
        keys = chunk_key_chain(source.namespace, seq.token_ids[: kv[0][0].shape[1]], chunk_tokens)
        self.saver.save(
            source,
            self._snapshot_runs(seq, keys, kv, chunk_tokens),
            before_put=lambda: self.namespaces.ensure_registered(source),
        )
        try:
            await self.saver.settle(source.namespace, keys, self.layer_timeout_seconds)
            found = await asyncio.wait_for(
                self.kvstore.lookup(source.namespace, keys), self.lookup_timeout_seconds
            )
        except Exception as exc:  # noqa: BLE001 -- the preempted sequence recomputes instead
            log.warning("resuming from the store failed; recomputing", error=repr(exc))
            return None
        stored = min(found.prefix_length, len(keys))
        if not stored:
            return None
        hit = _Hit(
            chunks=list(range(stored)),
            keys=keys[:stored],
            tiers=found.tiers[:stored],
            places=found.peers[:stored],
        )
        if self.restore is not None:
            seq.prefix, loader, _ = self._start_restore(
                self.restore, self.kvstore, source, hit, seq.token_ids
            )
        else:
            seq.prefix, loader = self._start_load(self.kvstore, source, hit, NO_TRUNCATION)
        self.resumed_from_store += 1
        return loader

    def _snapshot_runs(
        self, seq: EngineSequence, keys: list[bytes], kv: KV, chunk_tokens: int
    ) -> list[ChunkRun]:
        """A preempted sequence's snapshot chunks to save: every one as KV; in restore chunks
        (restore/turns.py), the ones it computed whole (and so captured: the others came from
        the store), in the storage plan's forms, its capture going on."""
        if self.restore is None:
            return [ChunkRun(keys, kv, 0)]
        captured = self.restore.take(seq, keep_watching=True)
        first = min(-(-captured.first // chunk_tokens), len(keys))
        start, stop = first * chunk_tokens, len(keys) * chunk_tokens
        span = [(k[:, start:stop], v[:, start:stop]) for k, v in kv]
        return [ChunkRun(keys[first:], span, start, self.restore.form(captured, start, stop))]

    async def _find_prefix(
        self,
        prompt: list[int],
        keys: list[bytes],
        source: KVSource | None,
        truncation: Truncation,
        history_tokens: int,
        pooled: int = 0,
    ) -> _Hit | None:
        """The stored run of the prompt's reusable chunks after the first `pooled` ones (the
        pool holds those), ending with the history's partial chunk when the history ends
        inside a chunk and nothing is truncated; None when there is nothing to look up.
        Raises when the daemon cannot answer in time."""
        if source is None or self.kvstore is None:
            return None
        chunks = truncation.reusable_chunks(len(prompt), source.chunk_tokens)
        tail = None
        if truncation == NO_TRUNCATION:
            tail = history_tail(prompt, keys, history_tokens, source.namespace, source.chunk_tokens)
        if tail is not None:
            chunks = chunks[: tail.full_chunks]  # the chunk holding the tail was never computed whole
        pooled = min(pooled, len(chunks))
        chunks, start_tokens = chunks[pooled:], pooled * source.chunk_tokens
        if not chunks and tail is None:
            return None
        if not await self.namespaces.ensure_registered(source):
            raise ConnectionError("the namespace is not registered with the daemon")
        wanted = [keys[index] for index in chunks] + ([tail.key] if tail is not None else [])
        if self.saver is not None:
            await self.saver.settle(source.namespace, wanted, self.layer_timeout_seconds)
        found = await asyncio.wait_for(
            self.kvstore.lookup(source.namespace, wanted), self.lookup_timeout_seconds
        )
        if tail is not None and found.prefix_length >= len(wanted):
            return _Hit(
                chunks=chunks, keys=wanted, tiers=found.tiers[: len(wanted)], places=found.peers[: len(wanted)],
                tail_tokens=tail.tokens, start_tokens=start_tokens,
            )  # fmt: skip
        hit = min(found.prefix_length, len(chunks))
        return _Hit(
            chunks=chunks[:hit], keys=wanted[:hit], tiers=found.tiers[:hit], places=found.peers[:hit],
            start_tokens=start_tokens,
        )  # fmt: skip


def _written(prefix: PrefixKV, seq: EngineSequence) -> bool:
    """Whether the loaded prefix went into `seq`'s blocks: not when the pool let go of the
    blocks before it (then they and it were recomputed)."""
    return seq.cached_tokens >= prefix.start_tokens


def _save_from_chunk(stored: _Hit | None, truncation: Truncation, source: KVSource | None) -> int:
    """The first chunk a turn saves: the kept chunks start at resume_at / C; the stored run
    of them (after chunk 0's sinks) is not saved again."""
    if source is None:
        return 0
    first_kept = truncation.resume_at // source.chunk_tokens
    return max(first_kept, stored.chunks[-1] + 1) if stored is not None and stored.chunks else first_kept
