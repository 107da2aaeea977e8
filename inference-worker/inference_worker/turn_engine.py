"""One turn of a conversation: plan the context (truncation.py), look up and start loading
the stored KV of the kept history (prefill.py), run the sequence in the engine (batched with
every other live turn: prefill, then decode), stream its tokens, and save the new KV in
the background.

    prompt ──plan──> Truncation ──start──> Sequence (+ stored prefix loading)
           ──Engine.generate──> TokenEvents ──> TurnStats ──> save the new chunks (background)

Decisions:
- A chat turn (save_generated) also stores the partial last chunk of what it computed,
  keyed like any chunk by its parent and its (fewer) tokens, and the next turn, told where
  the history ends (history_tokens), looks it up after the full chunks: without it a turn
  recomputes up to chunk_tokens - 1 tokens of history, measured as a third of a cached
  turn's TTFT on SmolLM2 with 64-token chunks. A tail is read once: the turn that reads it
  computes the full chunk over it and deletes it. Truncated turns neither save nor read
  tails (their chunk 0 is only the sinks; keep the rules few).
- A chunk is saved under its chain key over the original (untruncated) tokens, and its
  header records the position its keys were rotated for: where it sat in this turn's kept
  sequence. The loader rotates keys by the difference when a later turn, truncated further,
  serves it elsewhere.
- The KV of the last sampled token is never computed (decoding stops before feeding it),
  so the saved sequence is the prompt plus all generated tokens but the last. It is copied
  out of the sequence's pool blocks before they are released.
- A truncated turn that found no chunk 0 computes it whole after decoding (off the TTFT
  path) and saves it, so later turns have their attention sinks to load (prefill.py).
- A turn whose kept prompt plus max_tokens does not fit the KV pool runs over this worker
  and its peers (dist_attention/long_turn.py) when long_context.peers are set; without
  peers the engine refuses it (RESOURCE_EXHAUSTED) as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

import structlog
import torch
from transformers import PreTrainedModel

from attnstore.chunks.format import DTYPE_BYTES
from attnstore.chunks.keys import chunk_key
from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.decoding import (
    IncrementalDetokenizer,
    StopStrings,
    check_sampling,
    sample_params,
    stop_token_ids,
)
from inference_worker.dist_attention.attach import ChunkAttacher
from inference_worker.dist_attention.long_turn import LongTurns
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.engine import Engine
from inference_worker.engine.memory import pool_blocks
from inference_worker.engine.model_runner import PagedModelRunner
from inference_worker.engine.sequence import Sequence as EngineSequence
from inference_worker.kv_codec import DTYPE_NAMES, TORCH_DTYPES
from inference_worker.kv_saver import ChunkRun, ChunkSaver
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_runner import ModelRunner
from inference_worker.model_store import LoadedModel
from inference_worker.modules.module_store import ModuleStore
from inference_worker.modules.module_turn import ModuleTurns
from inference_worker.modules.pml_server import (
    PmlServer,
    chat_role_renderer,
    generation_prompt,
    model_tokenize,
)
from inference_worker.modules.repair_selection import RepairMethod
from inference_worker.namespaces import Namespaces
from inference_worker.prefill import Prefill, Prefiller
from inference_worker.restore.policy import RestorePolicy
from inference_worker.restore.turns import TurnRestore
from inference_worker.rotary_shift import PositionShiftUnsupported, RotaryShift
from inference_worker.settings import WorkerSettings
from inference_worker.truncation import NO_TRUNCATION, ContextWindow
from inference_worker.turn_types import (
    KVSource,
    SampleStats,
    SamplingParams,
    TokenEvent,
    TurnInput,
    TurnStats,
)

log = structlog.get_logger("inference_worker.turn_engine")


class TurnEngine:
    def __init__(
        self,
        model: LoadedModel,
        kvstore: AsyncKVStoreClient | None,
        settings: WorkerSettings,
        restore: RestorePolicy | None = None,
    ) -> None:
        """Takes its chunk size, context window, pool and timeouts from `settings` (their one
        source). `restore`: a storage plan that is not all KV (restore.policy.worker_policy):
        turns save and restore hidden states (restore/turns.py); None: KV. Raises
        ContextWindowError when the context settings do not suit the model, PoolTooSmall when
        the KV budget holds no block."""
        self.loaded = model
        self.runner = ModelRunner(model)
        geometry = self.runner.geometry
        chunk_tokens = settings.chunk_tokens
        self.window = ContextWindow.for_model(
            geometry.max_positions, settings.max_context_tokens, settings.attention_sink_tokens, chunk_tokens
        )
        self.namespaces = Namespaces(
            self.runner,
            kvstore,
            chunk_tokens=chunk_tokens,
            timeout_seconds=settings.lookup_timeout_seconds,
            storage_plan=restore.storage.namespace_tag if restore is not None else "",
        )
        self.stop_ids = stop_token_ids(model.model, model.tokenizer)
        try:
            shift: RotaryShift | None = RotaryShift(model.model)
        except PositionShiftUnsupported as exc:  # chunks then serve only at their stored positions
            log.info("keys cannot be re-positioned", reason=str(exc))
            shift = None
        self.engine = build_engine(model.model, model.dtype, model.device, geometry, settings)
        self.restore = TurnRestore(restore, self.engine.runner, shift) if restore is not None else None
        attacher = ChunkAttacher(
            settings.kvstore_channel.load("kvstore_channel"), settings.kvstore_channel.ssl_context(),
            settings.chunk_tokens, settings.long_context.peer_timeout_seconds,
        )  # fmt: skip
        self.long_turns = LongTurns(
            model, settings.long_context, settings.micro_attention, self.engine, attacher
        )
        self._saver = ChunkSaver(kvstore) if kvstore is not None else None
        self.prefiller = Prefiller(
            self.engine,
            kvstore,
            self.namespaces,
            shift,
            layer_timeout_seconds=settings.layer_timeout_seconds,
            lookup_timeout_seconds=settings.lookup_timeout_seconds,
            saver=self._saver,
            fetch_from_peers=settings.fetch_from_peers,
            restore=self.restore,
        )
        module_store = ModuleStore(
            self.engine,
            kvstore,
            self._saver,
            self.namespaces,
            timeout_seconds=settings.module_read_timeout_seconds,
            store_dtype=TORCH_DTYPES.get(settings.module_kv_dtype),  # "model": None
            cache_bytes=settings.module_cache_bytes,
        )
        pml = PmlServer(
            module_store,
            model_tokenize(model.tokenizer),
            chat_role_renderer(model.tokenizer),
            generation_prompt(model.tokenizer),
            compact_positions=settings.module_positions == "compact",
        )
        self.modules = ModuleTurns(
            self.engine,
            pml,
            model.tokenizer,
            shift,
            self.stop_ids,
            self.window.max_context_tokens,
            RepairMethod(settings.module_repair_method),
        )

    @property
    def max_turn_context_tokens(self) -> int:
        """The longest context (kept prompt + max_tokens) a turn may have here: the pool's
        tokens, or with peers for long turns long_context.max_context_tokens."""
        pool_tokens = self.engine.pool.num_blocks * self.engine.pool.block_tokens
        longest = self.long_turns.settings.max_context_tokens if self.long_turns.enabled else 0
        return min(max(longest, pool_tokens), self.window.max_context_tokens)

    async def namespace_for(self, tenant_salt: bytes) -> KVSource:
        """This model's namespace for a tenant, registered with the daemon on first use. A
        daemon error does not fail it: registration is retried by later lookups and saves."""
        return await self.namespaces.source_for(tenant_salt)

    async def drain_saves(self) -> None:
        """Waits for every background save started so far (tests, graceful shutdown)."""
        if self._saver is not None:
            await self._saver.drain()

    async def close(self) -> None:
        """Stops the engine's step loop (after the turns ended)."""
        await self.engine.close()
        self.long_turns.close()
        if self.restore is not None:
            self.restore.close()

    async def run_turn(
        self, turn: TurnInput, source: KVSource | None
    ) -> AsyncIterator[TokenEvent | TurnStats]:
        """Streams a TokenEvent per generated token, then exactly one TurnStats. Raises
        InvalidArgument (before any event) for a turn that cannot run, ResourceExhausted for
        one the KV pool can never hold."""
        started = time.perf_counter()
        prompt = list(turn.prompt_token_ids)
        check_sampling(turn.sampling)
        self.runner.check_prompt(prompt)
        peers = self.long_turns.check_peers(turn.long_context_peers)
        truncation = self.window.plan(len(prompt), turn.sampling.max_tokens, turn.truncated_tokens)
        kept = len(prompt) - truncation.dropped_tokens
        pool = self.engine.pool
        if self.long_turns.enabled and pool.blocks_for(kept + turn.sampling.max_tokens) > pool.num_blocks:
            seq = self._decoding(EngineSequence.of(truncation.kept(prompt)), turn.sampling)
            async for event in self.long_turns.run(len(prompt), truncation, seq, turn.sampling.n, peers):
                yield event
            return
        pending = await self.prefiller.start(prompt, source, truncation, turn.history_tokens)
        seq = self._decoding(pending.seq, turn.sampling)
        # Parallel sampling: the other samples fork from seq once its prompt is computed.
        seq.forks = [
            self._decoding(EngineSequence.of(seq.token_ids, seq.namespace, sample_index=index), turn.sampling)
            for index in range(1, turn.sampling.n)
        ]
        samples = [seq, *seq.forks]
        if source is not None and truncation == NO_TRUNCATION:  # keys line up
            seq.store_chunk_tokens = source.chunk_tokens  # preempted, it resumes from the store
        if self.restore is not None and source is not None:
            self.restore.watch(seq)
        detokenizers = [IncrementalDetokenizer(self.loaded.tokenizer, seq.token_ids) for _ in samples]
        prefill: Prefill | None = None
        first_token_at = started
        resumes: list[asyncio.Task[None]] = []
        try:
            async with contextlib.aclosing(self.engine.generate(seq)) as outputs:
                async for output in outputs:
                    if output.preempted and source is not None:
                        if (loader := await self.prefiller.resume(output.seq, source)) is not None:
                            resumes.append(loader)
                        self.engine.submit(output.seq)
                        continue
                    if output.token is None:  # max_new_tokens >= 1: every other output carries one
                        continue
                    if prefill is None:
                        first_token_at = time.perf_counter()
                        prefill = await self.prefiller.finish(pending, first_token_at)
                    index = output.seq.sample_index
                    text = detokenizers[index].add(output.token, final=output.finished)
                    if output.finished and index:
                        self.engine.release(output.seq)  # only sample 0's KV is saved
                    yield TokenEvent(output.token, text, index)
            if prefill is None:
                raise RuntimeError(f"the engine ended sequence {seq.seq_id} without a token")
            generated = seq.generated
            # The last token's KV was never computed: it was not fed back.
            sequence = prompt + generated[:-1] if turn.save_generated else prompt
            keys: list[bytes] = []
            saved = 0
            if source is not None:
                keys = extend_key_chain(source.namespace, prefill.prompt_keys, sequence, source.chunk_tokens)
                tail = sequence[len(keys) * source.chunk_tokens :] if turn.save_generated else []
                saved = await self._save(source, prompt, keys, tail, prefill, seq)
        finally:
            if prefill is None and pending.loader is not None:
                resumes.append(pending.loader)
            for loader in resumes:
                loader.cancel()  # ends a read still running (and its lease) at once
            await asyncio.gather(*resumes, return_exceptions=True)
            if self.restore is not None:
                for loader in resumes:  # resumes' restores count in metrics and calibration
                    self.restore.settled(loader)
                self.restore.forget(seq)  # a turn that ended before saving
            self.engine.release(seq)
        yield TurnStats(
            prompt_tokens=len(prompt),
            reused_tokens=prefill.reused_tokens,
            reused_dram_chunks=prefill.reused_dram_chunks,
            reused_ssd_chunks=prefill.reused_ssd_chunks,
            generated_tokens=sum(len(sample.generated) for sample in samples),
            ttft_seconds=first_token_at - started,
            kv_load_seconds=prefill.kv_load_seconds,
            kv_load_exposed_seconds=prefill.kv_load_exposed_seconds,
            compute_seconds=prefill.compute_seconds,
            saved_chunks=saved,
            fallback=prefill.fallback,
            finish_reason=seq.finish_reason or "length",
            truncated_tokens=truncation.dropped_tokens,
            sink_tokens=truncation.sink_tokens,
            namespace=source.namespace if source is not None else b"",
            chunk_keys=tuple(keys),
            namespace_refused=self.namespaces.refusal(source.namespace) if source is not None else "",
            restore_plan=prefill.restore_plan,
            restore_seconds=prefill.restore_seconds,
            samples=tuple(
                SampleStats(len(sample.generated), sample.finish_reason or "length") for sample in samples
            ),
        )

    def _decoding(self, seq: EngineSequence, sampling: SamplingParams) -> EngineSequence:
        """`seq` set up to decode as sample `seq.sample_index` of a turn with `sampling`."""
        seq.sampling = sample_params(sampling, seq.sample_index)
        seq.stops = self.stop_ids | frozenset(sampling.stop_token_ids)
        if sampling.stop_strings:
            seq.stop_text = StopStrings(self.loaded.tokenizer, seq.token_ids, sampling.stop_strings)
        seq.max_new_tokens = sampling.max_tokens  # the truncation plan made them fit the window
        return seq

    async def _save(
        self,
        source: KVSource,
        prompt: list[int],
        keys: list[bytes],
        tail: list[int],
        prefill: Prefill,
        seq: EngineSequence,
    ) -> int:
        """Starts saving the chunks of `keys` the store lacks, then the partial chunk of the
        `tail` tokens that follow them (none when truncated); how many full ones. Their KV
        is copied out of `seq`'s blocks first (still held: released after this)."""
        if self._saver is None:
            return 0
        chunk_tokens, dropped = source.chunk_tokens, prefill.truncation.dropped_tokens
        runs: list[ChunkRun] = []
        if prefill.sink_chunk_missing:  # chunk 0 whole, at its own positions: the next turns' sinks
            sinks = await self.prefiller.prefill(prompt[:chunk_tokens], None)
            if sinks.kv is not None:
                sink_form = None
                if self.restore is not None and sinks.hidden is not None:
                    sink_form = self.restore.form(sinks.hidden, 0, chunk_tokens)
                runs.append(ChunkRun(keys[:1], sinks.kv, 0, sink_form))
        first = prefill.save_from_chunk
        captured = self.restore.take(seq) if self.restore is not None else None
        if captured is not None:  # only chunks whose every token this turn computed
            first_computed = captured.first + dropped  # in original tokens
            first = min(max(first, -(-first_computed // chunk_tokens)), len(keys))
        start = first * chunk_tokens - dropped  # where chunk `first` sits in the kept sequence
        stop = len(keys) * chunk_tokens - dropped
        with_tail = bool(tail) and prefill.truncation == NO_TRUNCATION
        if captured is not None and captured.first > stop:  # a tail it did not compute: not saved
            with_tail = False
        span_stop = stop + len(tail) if with_tail else stop
        kv = await asyncio.to_thread(self.engine.kv.span, seq.block_table, start, span_stop)
        if keys[first:]:
            form = (
                None if captured is None or self.restore is None else self.restore.form(captured, start, stop)
            )
            kept_kv = [(k[:, : stop - start], v[:, : stop - start]) for k, v in kv]
            runs.append(ChunkRun(keys[first:], kept_kv, start, form))
        if with_tail:
            tail_kv = [(k[:, stop - start :], v[:, stop - start :]) for k, v in kv]
            tail_form = None
            if captured is not None and self.restore is not None:
                tail_form = self.restore.form(captured, stop, span_stop)
            tail_key = chunk_key(source.namespace, keys[-1] if keys else None, tail)
            runs.append(ChunkRun([tail_key], tail_kv, stop, tail_form))
        saved = self._saver.save(
            source,
            runs,
            replace_keys=(*prefill.replace_keys, *prefill.stale_keys),
            before_put=lambda: self.namespaces.ensure_registered(source),
        )
        return saved - with_tail


def extend_key_chain(
    namespace: bytes, keys: Sequence[bytes], tokens: Sequence[int], chunk_tokens: int
) -> list[bytes]:
    """The chain keys of every full chunk of `tokens`, given `keys`, those of its first chunks
    (chunk_key_chain without hashing them again)."""
    chain = list(keys)
    for start in range(len(chain) * chunk_tokens, len(tokens) - chunk_tokens + 1, chunk_tokens):
        chain.append(chunk_key(namespace, chain[-1] if chain else None, tokens[start : start + chunk_tokens]))
    return chain


def build_engine(
    model: PreTrainedModel,
    dtype: torch.dtype,
    device: torch.device,
    geometry: ModelGeometry,
    settings: WorkerSettings,
) -> Engine:
    """The engine over `model` (weights in `dtype` on `device`) and its KV pool, sized from
    the settings (engine/memory.py)."""
    blocks = pool_blocks(
        geometry,
        settings.block_tokens,
        DTYPE_BYTES[DTYPE_NAMES[dtype]],
        device,
        kv_memory_bytes=settings.kv_memory_bytes,
        kv_memory_fraction=settings.kv_memory_fraction,
    )
    kv = PagedKV(geometry, blocks, settings.block_tokens, dtype, device)
    runner = PagedModelRunner(model, kv, layer_timeout_seconds=settings.layer_timeout_seconds)
    pool = BlockPool(blocks, settings.block_tokens, keep_freed_prefixes=settings.pool_keeps_freed_prefixes)
    log.info(
        "kv_pool",
        blocks=blocks,
        block_tokens=settings.block_tokens,
        bytes=blocks
        * PagedKV.bytes_per_block(geometry, settings.block_tokens, DTYPE_BYTES[DTYPE_NAMES[dtype]]),
        decode_attention=runner.decode_choice.kernel,
        decode_attention_reason=runner.decode_choice.reason,
        prefill_attention=runner.prefill_choice.kernel,
        prefill_attention_reason=runner.prefill_choice.reason,
        row_kernels=runner.row_choice.kernel,
        row_kernels_reason=runner.row_choice.reason,
        layer_blocks=runner.layer_blocks_choice.kernel,
        layer_blocks_reason=runner.layer_blocks_choice.reason,
    )
    return Engine(
        runner,
        pool,
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_sequences=settings.max_batch_sequences,
    )
