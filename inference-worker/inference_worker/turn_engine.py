"""One turn of a conversation: reuse the stored KV of the prompt's history, prefill only the
new tokens, decode, and save the new KV, without the cache ever failing the turn.

    prompt ──chunk keys──> Lookup ──hit──> load_prefix (event loop) ──PrefixKV──┐
                                                                             per layer
           new tokens at positions [hit tokens, prompt) ──forward (thread)─> LayerwiseCache
    decode ──TokenEvents──> TurnStats ──> save the new full chunks (background task)

Decisions:
- The reusable prefix is the longest run of whole chunks strictly shorter than the prompt,
  so at least the last prompt token is computed: its logits start the decoding.
- The partial tail chunk is never stored; the next turn recomputes those < chunk_tokens
  tokens. Storing it under a length-keyed name would save at most one chunk of compute per
  turn, at the price of a second key chain to look up and of the stored tail turning stale
  at every turn that extends it.
- A chunk's header records the position its keys were rotated for: its index in this
  turn's sequence times chunk_tokens (positions count from the first kept token, so after
  truncation they are post-truncation positions). The loader rotates keys by the
  difference when a chunk is served elsewhere.
- The KV of the last sampled token is never computed (decoding stops before feeding it),
  so the saved sequence is the prompt plus all generated tokens but the last.
- Forward passes run in a worker thread, one at a time per engine, so the event loop keeps
  feeding the prefix loader (and other turns) while torch computes.
- Fallbacks: a lookup that fails or times out is DAEMON_UNAVAILABLE; a layer that misses
  its deadline is DEADLINE; a corrupt, malformed or vanished chunk is CHUNK_INVALID, and
  the hit chunks are then deleted before the turn's save puts them again (a put alone
  would keep a corrupt chunk as "already stored").
- Context-overflow truncation (`TurnInput.truncated_tokens`) is not implemented yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import structlog
import torch
from transformers import DynamicCache

from attnstore.chunks.keys import chunk_key_chain
from attnstore.errors import InvalidArgument
from attnstore.kvstore_client import AsyncKVStoreClient, Tier
from inference_worker.decoding import Decoding, check_sampling, decode, stop_token_ids
from inference_worker.kv_saver import ChunkSaver
from inference_worker.layerwise_cache import LayerwiseCache, PrefixKV, PrefixLoadFailed
from inference_worker.model_runner import ModelRunner
from inference_worker.model_store import LoadedModel
from inference_worker.namespaces import Namespaces
from inference_worker.prefix_loader import classify_failure, load_prefix
from inference_worker.rotary_shift import PositionShiftUnsupported, RotaryShift
from inference_worker.turn_types import Fallback, KVSource, TokenEvent, TurnInput, TurnStats

log = structlog.get_logger("inference_worker.turn_engine")

DEFAULT_CHUNK_TOKENS = 256


@dataclass
class Prefill:
    """A prompt's KV and the logits of its last token, and how they were obtained."""

    cache: DynamicCache  # KV of every prompt token, ready for decoding
    logits: torch.Tensor  # [vocab] fp32, of the last prompt token
    reused_tokens: int = 0
    reused_dram_chunks: int = 0
    reused_ssd_chunks: int = 0
    kv_load_seconds: float = 0.0
    kv_load_exposed_seconds: float = 0.0
    compute_seconds: float = 0.0  # forward time, waits for KV excluded
    fallback: Fallback | None = None
    stored_chunks: int = 0  # leading chunks known to be stored: not saved again
    evict_keys: tuple[bytes, ...] = ()  # stored chunks that failed to load: replaced when saving


@dataclass(frozen=True)
class _Hit:
    keys: list[bytes]  # keys of the chunks to load, in order
    tiers: list[Tier]


class TurnEngine:
    def __init__(
        self,
        model: LoadedModel,
        kvstore: AsyncKVStoreClient | None,
        *,
        layer_timeout_seconds: float = 2.0,
        lookup_timeout_seconds: float = 0.5,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    ) -> None:
        self.loaded = model
        self.kvstore = kvstore
        self.runner = ModelRunner(model)
        self.layer_timeout_seconds = layer_timeout_seconds
        self.lookup_timeout_seconds = lookup_timeout_seconds
        self.namespaces = Namespaces(
            self.runner, kvstore, chunk_tokens=chunk_tokens, timeout_seconds=lookup_timeout_seconds
        )
        self.stop_ids = stop_token_ids(model.model, model.tokenizer)
        try:
            self.shift: RotaryShift | None = RotaryShift(model.model)
        except PositionShiftUnsupported as exc:  # chunks then serve only at their stored positions
            log.info("keys cannot be re-positioned", reason=str(exc))
            self.shift = None
        self._saver = ChunkSaver(kvstore) if kvstore is not None else None

    async def namespace_for(self, tenant_salt: bytes) -> KVSource:
        """This model's namespace for a tenant, registered with the daemon on first use. A
        daemon error does not fail it: registration is retried by later lookups and saves."""
        return await self.namespaces.source_for(tenant_salt)

    async def drain_saves(self) -> None:
        """Waits for every background save started so far (tests, graceful shutdown)."""
        if self._saver is not None:
            await self._saver.drain()

    # ---- a turn ------------------------------------------------------------------------------

    async def run_turn(
        self, turn: TurnInput, source: KVSource | None
    ) -> AsyncIterator[TokenEvent | TurnStats]:
        """Streams a TokenEvent per generated token, then exactly one TurnStats. Raises
        InvalidArgument (before any event) for a turn that cannot run."""
        started = time.perf_counter()
        prompt = list(turn.prompt_token_ids)
        check_sampling(turn.sampling)
        self.runner.check_prompt(prompt)
        if turn.truncated_tokens:
            raise InvalidArgument("context-overflow truncation (truncated_tokens > 0) is not supported yet")
        prefill = await self.prefill(prompt, source)
        state = Decoding()
        events = decode(
            self.runner,
            prefill.cache,
            prefill.logits,
            prompt=prompt,
            params=turn.sampling,
            stops=self.stop_ids | frozenset(turn.sampling.stop_token_ids),
            tokenizer=self.loaded.tokenizer,
            state=state,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                yield event
        generated = state.tokens

        saved = 0
        if self._saver is not None and source is not None:
            # The last token's KV was never computed: it was not fed back.
            history = prompt + generated[:-1] if turn.save_generated else prompt
            saved = self._saver.save_new_chunks(
                source,
                history,
                prefill.cache,
                stored_chunks=prefill.stored_chunks,
                evict_keys=prefill.evict_keys,
                before_put=lambda: self.namespaces.ensure_registered(source),
            )
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
        )

    # ---- prefill -----------------------------------------------------------------------------

    async def prefill(self, prompt_token_ids: Sequence[int], source: KVSource | None) -> Prefill:
        """The prompt's KV and last-token logits: the stored prefix reused when the store has
        it, the rest computed; any cache failure recomputes the whole prompt instead."""
        prompt = list(prompt_token_ids)
        fallback: Fallback | None = None
        lost_seconds = 0.0  # spent on a failed reuse attempt
        try:
            hit = await self._find_prefix(prompt, source)
        except Exception as exc:  # noqa: BLE001 -- any lookup failure means recompute
            log.warning("lookup failed; recomputing", error=repr(exc))
            hit, fallback = None, Fallback.DAEMON_UNAVAILABLE
        if hit is not None and source is not None and self.kvstore is not None:
            attempt_started = time.perf_counter()
            try:
                return await self._prefill_on_prefix(self.kvstore, prompt, source, hit)
            except PrefixLoadFailed as exc:
                fallback = classify_failure(exc)
                lost_seconds = time.perf_counter() - attempt_started
                log.warning(
                    "loading the stored prefix failed; recomputing", fallback=fallback.value, error=str(exc)
                )
        cache = self.runner.new_cache()
        logits, seconds = await asyncio.to_thread(self.runner.forward, prompt, 0, cache)
        invalid = hit is not None and fallback is Fallback.CHUNK_INVALID
        return Prefill(
            cache=cache,
            logits=logits,
            kv_load_seconds=lost_seconds,
            kv_load_exposed_seconds=lost_seconds,  # the whole failed attempt delayed the turn
            compute_seconds=seconds,
            fallback=fallback,
            stored_chunks=0 if hit is None or invalid else len(hit.keys),
            evict_keys=tuple(hit.keys) if hit is not None and invalid else (),
        )

    async def _find_prefix(self, prompt: list[int], source: KVSource | None) -> _Hit | None:
        """The stored run of the prompt's reusable chunks; None when nothing is to be reused.
        Raises when the daemon cannot answer in time."""
        if source is None or self.kvstore is None:
            return None
        reusable = (len(prompt) - 1) // source.chunk_tokens  # whole chunks, last token excluded
        if reusable == 0:
            return None
        if not await self.namespaces.ensure_registered(source):
            raise ConnectionError("the namespace is not registered with the daemon")
        keys = chunk_key_chain(
            source.namespace, prompt[: reusable * source.chunk_tokens], source.chunk_tokens
        )
        found = await asyncio.wait_for(
            self.kvstore.lookup(source.namespace, keys), self.lookup_timeout_seconds
        )
        hit = min(found.prefix_length, reusable)
        return _Hit(keys=keys[:hit], tiers=found.tiers[:hit]) if hit else None

    async def _prefill_on_prefix(
        self, client: AsyncKVStoreClient, prompt: list[int], source: KVSource, hit: _Hit
    ) -> Prefill:
        """Loads the hit chunks in the background while the rest of the prompt is computed on
        top of them; raises PrefixLoadFailed (after ending the load) when they do not come."""
        prefix = PrefixKV(self.runner.num_layers, len(hit.keys) * source.chunk_tokens)
        cache = LayerwiseCache(prefix, self.loaded.config, layer_timeout_seconds=self.layer_timeout_seconds)
        loader = asyncio.create_task(
            load_prefix(
                client,
                source.namespace,
                hit.keys,
                prefix,
                chunk_tokens=source.chunk_tokens,
                first_position=0,
                shift=self.shift,
                device=self.loaded.device,
            )
        )
        try:
            logits, seconds = await asyncio.to_thread(
                self.runner.forward, prompt[prefix.prefix_tokens :], prefix.prefix_tokens, cache
            )
        except BaseException:
            loader.cancel()  # ends the read (and its lease) at once
            raise
        finally:
            await asyncio.gather(loader, return_exceptions=True)
        return Prefill(
            cache=cache,
            logits=logits,
            reused_tokens=prefix.prefix_tokens,
            reused_dram_chunks=sum(tier is Tier.DRAM for tier in hit.tiers),
            reused_ssd_chunks=sum(tier is Tier.SSD for tier in hit.tiers),
            kv_load_seconds=prefix.load_seconds or 0.0,
            kv_load_exposed_seconds=cache.exposed_load_seconds,
            compute_seconds=seconds - cache.exposed_load_seconds,
            stored_chunks=len(hit.keys),
        )
