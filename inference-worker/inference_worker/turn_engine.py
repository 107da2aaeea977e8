"""One turn of a conversation: plan the context (truncation.py), prefill reusing the stored
KV of the kept history (prefill.py), decode, and save the new KV in the background.

    prompt ──plan──> Truncation ──prefill──> Prefill ──decode──> TokenEvents
           ──> TurnStats ──> save the new chunks (background task)

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
  so the saved sequence is the prompt plus all generated tokens but the last.
- A truncated turn that found no chunk 0 computes it whole after decoding (off the TTFT
  path) and saves it, so later turns have their attention sinks to load (prefill.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

import structlog

from attnstore.chunks.keys import chunk_key
from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.decoding import Decoding, check_sampling, decode, stop_token_ids
from inference_worker.kv_saver import KV, ChunkRun, ChunkSaver, cache_span
from inference_worker.model_runner import ModelRunner
from inference_worker.model_store import LoadedModel
from inference_worker.namespaces import Namespaces
from inference_worker.prefill import Prefill, Prefiller
from inference_worker.rotary_shift import PositionShiftUnsupported, RotaryShift
from inference_worker.settings import WorkerSettings
from inference_worker.truncation import NO_TRUNCATION, ContextWindow
from inference_worker.turn_types import KVSource, TokenEvent, TurnInput, TurnStats

log = structlog.get_logger("inference_worker.turn_engine")


class TurnEngine:
    def __init__(
        self, model: LoadedModel, kvstore: AsyncKVStoreClient | None, settings: WorkerSettings
    ) -> None:
        """Takes its chunk size, context window and timeouts from `settings` (their one
        source). Raises ContextWindowError when the context settings do not suit the model."""
        self.loaded = model
        self.runner = ModelRunner(model)
        chunk_tokens = settings.chunk_tokens
        self.window = ContextWindow.for_model(
            self.runner.geometry.max_positions,
            settings.max_context_tokens,
            settings.attention_sink_tokens,
            chunk_tokens,
        )
        self.namespaces = Namespaces(
            self.runner, kvstore, chunk_tokens=chunk_tokens, timeout_seconds=settings.lookup_timeout_seconds
        )
        self.stop_ids = stop_token_ids(model.model, model.tokenizer)
        try:
            shift: RotaryShift | None = RotaryShift(model.model)
        except PositionShiftUnsupported as exc:  # chunks then serve only at their stored positions
            log.info("keys cannot be re-positioned", reason=str(exc))
            shift = None
        self._saver = ChunkSaver(kvstore) if kvstore is not None else None
        self.prefiller = Prefiller(
            self.runner,
            kvstore,
            self.namespaces,
            shift,
            layer_timeout_seconds=settings.layer_timeout_seconds,
            lookup_timeout_seconds=settings.lookup_timeout_seconds,
            saver=self._saver,
        )

    async def namespace_for(self, tenant_salt: bytes) -> KVSource:
        """This model's namespace for a tenant, registered with the daemon on first use. A
        daemon error does not fail it: registration is retried by later lookups and saves."""
        return await self.namespaces.source_for(tenant_salt)

    async def drain_saves(self) -> None:
        """Waits for every background save started so far (tests, graceful shutdown)."""
        if self._saver is not None:
            await self._saver.drain()

    async def run_turn(
        self, turn: TurnInput, source: KVSource | None
    ) -> AsyncIterator[TokenEvent | TurnStats]:
        """Streams a TokenEvent per generated token, then exactly one TurnStats. Raises
        InvalidArgument (before any event) for a turn that cannot run."""
        started = time.perf_counter()
        prompt = list(turn.prompt_token_ids)
        check_sampling(turn.sampling)
        self.runner.check_prompt(prompt)
        truncation = self.window.plan(len(prompt), turn.sampling.max_tokens, turn.truncated_tokens)
        prefill = await self.prefiller.prefill(prompt, source, truncation, turn.history_tokens)
        state = Decoding()
        events = decode(
            self.runner,
            prefill.cache,
            prefill.logits,
            prompt=truncation.kept(prompt),
            params=turn.sampling,
            stops=self.stop_ids | frozenset(turn.sampling.stop_token_ids),
            tokenizer=self.loaded.tokenizer,
            state=state,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                yield event
        generated = state.tokens

        # The last token's KV was never computed: it was not fed back.
        sequence = prompt + generated[:-1] if turn.save_generated else prompt
        keys: list[bytes] = []
        saved = 0
        if source is not None:
            keys = extend_key_chain(source.namespace, prefill.prompt_keys, sequence, source.chunk_tokens)
            tail = sequence[len(keys) * source.chunk_tokens :] if turn.save_generated else []
            saved = await self._save(source, prompt, keys, tail, prefill)
        yield TurnStats(
            prompt_tokens=len(prompt),
            reused_tokens=prefill.reused_tokens,
            reused_dram_chunks=prefill.reused_dram_chunks,
            reused_ssd_chunks=prefill.reused_ssd_chunks,
            generated_tokens=len(generated),
            ttft_seconds=(state.first_token_at or started) - started,
            kv_load_seconds=prefill.kv_load_seconds,
            kv_load_exposed_seconds=prefill.kv_load_exposed_seconds,
            compute_seconds=prefill.compute_seconds,
            saved_chunks=saved,
            fallback=prefill.fallback,
            finish_reason="stop" if state.stopped else "length",
            truncated_tokens=truncation.dropped_tokens,
            sink_tokens=truncation.sink_tokens,
            namespace=source.namespace if source is not None else b"",
            chunk_keys=tuple(keys),
        )

    async def _save(
        self, source: KVSource, prompt: list[int], keys: list[bytes], tail: list[int], prefill: Prefill
    ) -> int:
        """Starts saving the chunks of `keys` the store lacks, then the partial chunk of the
        `tail` tokens that follow them (none when truncated); how many full ones."""
        if self._saver is None:
            return 0
        chunk_tokens, dropped = source.chunk_tokens, prefill.truncation.dropped_tokens
        spans: list[tuple[list[bytes], KV | None, int]] = []  # keys, their KV, base position
        if prefill.sink_chunk_missing:  # chunk 0 whole, at its own positions: the next turns' sinks
            scratch = self.runner.new_cache()
            await asyncio.to_thread(self.runner.forward, prompt[:chunk_tokens], 0, scratch)
            spans.append((keys[:1], cache_span(scratch, 0, chunk_tokens), 0))
        first = prefill.save_from_chunk
        start = first * chunk_tokens - dropped  # where chunk `first` sits in the kept sequence
        stop = len(keys) * chunk_tokens - dropped
        spans.append((keys[first:], cache_span(prefill.cache, start, stop), start))
        tail_kv = None
        if tail and prefill.truncation == NO_TRUNCATION:
            tail_kv = cache_span(prefill.cache, stop, stop + len(tail))
        runs = [ChunkRun(run_keys, kv, base) for run_keys, kv, base in spans if kv is not None]
        if len(runs) < len(spans):
            log.info("the cache does not hold every token (sliding window): not saving them all")
        if tail_kv is not None:
            runs.append(
                ChunkRun([chunk_key(source.namespace, keys[-1] if keys else None, tail)], tail_kv, stop)
            )
        saved = self._saver.save(
            source,
            runs,
            evict_keys=(*prefill.evict_keys, *prefill.stale_keys),
            before_put=lambda: self.namespaces.ensure_registered(source),
        )
        return saved - (tail_kv is not None)


def extend_key_chain(
    namespace: bytes, keys: Sequence[bytes], tokens: Sequence[int], chunk_tokens: int
) -> list[bytes]:
    """The chain keys of every full chunk of `tokens`, given `keys`, those of its first chunks
    (chunk_key_chain without hashing them again)."""
    chain = list(keys)
    for start in range(len(chain) * chunk_tokens, len(tokens) - chunk_tokens + 1, chunk_tokens):
        chain.append(chunk_key(namespace, chain[-1] if chain else None, tokens[start : start + chunk_tokens]))
    return chain
