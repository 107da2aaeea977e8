"""Context overflow through a real daemon: a turn whose prompt and max_tokens outgrow the
window keeps 4 attention sinks, drops whole chunks after them and reuses the stored KV of
the kept chunks at their new positions.

What reuse must equal: with one layer, a token's K and V depend only on the token and its
position, so a truncated turn reusing re-positioned KV gives exactly what recomputing the
kept tokens from scratch gives (logits within 1e-4, the same greedy tokens). With more
layers the stored KV of a kept chunk was computed while it attended to the tokens since
dropped, so reuse is not recomputation: it equals the same full-context KV truncated and
re-positioned by hand (the approximation AttentionStore makes; its cost in perplexity is
measured on the real model in test_truncation_perplexity.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
import torch
from transformers import DynamicCache
from turn_events import collect_turn, random_tokens

from attnstore.chunks.keys import chunk_key_chain
from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.model_store import LoadedModel
from inference_worker.rotary_shift import RotaryShift
from inference_worker.settings import WorkerSettings
from inference_worker.truncation import Truncation
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource, SamplingParams, TurnInput, TurnStats
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(120)

CHUNK_TOKENS = 16
SINK_TOKENS = 4
CONTEXT_TOKENS = 128
ANSWER_TOKENS = 16
LOGITS_TOLERANCE = 1e-4
# Turn 1: 80 prompt tokens (5 chunks) + 16 answer tokens fit the 128-token window.
# Turn 2: 136 prompt tokens + 16 do not: 24 too many, so chunk 0's tail and chunk 1 go
# (28 tokens, resuming at token 32), and chunks 0 (its sinks), 2, 3 and 4 are reused.
FIRST_PROMPT_TOKENS = 80
NEW_TOKENS = 40
DROPPED = 2 * CHUNK_TOKENS - SINK_TOKENS


def make_engine(model: LoadedModel, client: AsyncKVStoreClient | None) -> TurnEngine:
    settings = WorkerSettings(
        chunk_tokens=CHUNK_TOKENS, max_context_tokens=CONTEXT_TOKENS, attention_sink_tokens=SINK_TOKENS
    )
    return TurnEngine(model, client, settings)


@asynccontextmanager
async def engine_on(model: LoadedModel, daemon: DaemonProcess) -> AsyncIterator[tuple[TurnEngine, KVSource]]:
    """An engine whose store is `daemon`, and a tenant's KV source on it."""
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = make_engine(model, client)
        yield engine, await engine.namespace_for(b"tenant")


async def run_turn(
    engine: TurnEngine,
    prompt: Sequence[int],
    source: KVSource | None,
    truncated_tokens: int = 0,
    max_tokens: int = ANSWER_TOKENS,
) -> tuple[list[int], TurnStats]:
    turn = TurnInput(list(prompt), SamplingParams(max_tokens=max_tokens), truncated_tokens=truncated_tokens)
    return await collect_turn(engine.run_turn(turn, source))


async def overflowing_prompt(engine: TurnEngine, source: KVSource) -> list[int]:
    """Runs turn 1 (it fits; its 5 chunks are saved); turn 2's prompt, which does not fit."""
    prompt = random_tokens(FIRST_PROMPT_TOKENS, seed=1)
    answer, stats = await run_turn(engine, prompt, source)
    assert stats.truncated_tokens == 0 and stats.saved_chunks == 5
    await engine.drain_saves()
    return prompt + answer + random_tokens(NEW_TOKENS, seed=2)


async def test_an_overflowing_turn_reuses_kept_chunks_as_recomputing_them_would(
    one_layer_model: LoadedModel, daemon: DaemonProcess
) -> None:
    async with engine_on(one_layer_model, daemon) as (engine, source):
        prompt = await overflowing_prompt(engine, source)
        truncation = Truncation(sink_tokens=SINK_TOKENS, dropped_tokens=DROPPED)
        kept = truncation.kept(prompt)

        cached = await engine.prefiller.prefill(prompt, source, truncation)
        recomputed = await engine.prefiller.prefill(kept, None)
        assert cached.reused_tokens == SINK_TOKENS + 3 * CHUNK_TOKENS and cached.fallback is None
        assert (cached.logits - recomputed.logits).abs().max().item() <= LOGITS_TOLERANCE

        tokens, stats = await run_turn(engine, prompt, source)
        reference, _ = await run_turn(engine, kept, None)
        assert tokens == reference and len(tokens) == ANSWER_TOKENS
        assert (stats.truncated_tokens, stats.sink_tokens) == (DROPPED, SINK_TOKENS)
        assert stats.reused_tokens == cached.reused_tokens and stats.reused_dram_chunks == 4
        assert stats.prompt_tokens == len(prompt) == 136 and stats.fallback is None
        # Chunks 5..8 of prompt + answer (all but the last token) are new; keys stay original.
        sequence = prompt + tokens[:-1]
        assert stats.chunk_keys == tuple(chunk_key_chain(source.namespace, sequence, CHUNK_TOKENS))
        assert len(stats.chunk_keys) == 9 and stats.saved_chunks == 4
        assert stats.namespace == source.namespace
        await engine.drain_saves()

        # A retry of turn 2 with max_tokens 1 would fit with 12 tokens dropped, but asks for the
        # session's truncation: it keeps it, and reuses chunks 5..7 where turn 2 computed them.
        assert len(prompt) + 1 - CONTEXT_TOKENS <= CHUNK_TOKENS - SINK_TOKENS
        retry, stats = await run_turn(engine, prompt, source, truncated_tokens=DROPPED, max_tokens=1)
        assert stats.truncated_tokens == DROPPED and retry == tokens[:1]
        assert stats.reused_tokens == SINK_TOKENS + 6 * CHUNK_TOKENS  # chunks 0 (sinks), 2..7

        # Turn 3 overflows by more than the session dropped so far: chunks 2..4 go too, and
        # chunks 5..8, stored by turn 2 at positions 52.., move back 48 positions.
        prompt = sequence + tokens[-1:] + random_tokens(30, seed=3)
        tokens, stats = await run_turn(engine, prompt, source, truncated_tokens=DROPPED)
        assert (stats.truncated_tokens, stats.sink_tokens) == (5 * CHUNK_TOKENS - SINK_TOKENS, SINK_TOKENS)
        assert stats.reused_tokens == SINK_TOKENS + 4 * CHUNK_TOKENS and stats.fallback is None
        reference, _ = await run_turn(
            engine, Truncation(SINK_TOKENS, stats.truncated_tokens).kept(prompt), None
        )
        assert tokens == reference
        await engine.drain_saves()


async def test_reuse_equals_the_full_context_kv_truncated_and_repositioned(
    tiny_model: LoadedModel, daemon: DaemonProcess
) -> None:
    async with engine_on(tiny_model, daemon) as (engine, source):
        prompt = await overflowing_prompt(engine, source)
        cached = await engine.prefiller.prefill(prompt, source, Truncation(SINK_TOKENS, DROPPED))
        assert cached.reused_tokens == SINK_TOKENS + 3 * CHUNK_TOKENS

    # By hand: turn 1's KV of tokens 0..79, tokens 4..31 dropped, keys of 32..79 rotated back
    # by 28 positions, then the rest of the kept prompt computed on top.
    model, resume = tiny_model.model, 2 * CHUNK_TOKENS
    shift = RotaryShift(model)
    with torch.no_grad():
        full = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([prompt[:FIRST_PROMPT_TOKENS]]), cache=full, use_cache=True)
        truncated = DynamicCache(config=model.config)
        for index, layer in enumerate(full.layers):
            keys, values = layer.keys, layer.values  # [1, kv_heads, 80, head_dim]
            kept_keys = torch.cat(
                (keys[:, :, :SINK_TOKENS], shift.shift_keys(keys[:, :, resume:], -DROPPED)), 2
            )
            kept_values = torch.cat((values[:, :, :SINK_TOKENS], values[:, :, resume:]), dim=2)
            truncated.update(kept_keys, kept_values, index)
        first = FIRST_PROMPT_TOKENS - DROPPED  # 52 tokens in the truncated cache
        rest = torch.tensor([prompt[FIRST_PROMPT_TOKENS:]])  # [1, 56]
        positions = torch.arange(first, first + rest.shape[1]).unsqueeze(0)
        logits = model(input_ids=rest, position_ids=positions, cache=truncated).logits[0, -1]
    assert (cached.logits - logits).abs().max().item() <= LOGITS_TOLERANCE

    # Not recomputation: the kept chunks' KV remembers the dropped tokens.
    recomputed = await engine.prefiller.prefill(Truncation(SINK_TOKENS, DROPPED).kept(prompt), None)
    assert (cached.logits - recomputed.logits).abs().max().item() > 100 * LOGITS_TOLERANCE


async def test_a_first_turn_that_overflows_stores_chunk_zero_for_the_next(
    one_layer_model: LoadedModel, daemon: DaemonProcess
) -> None:
    async with engine_on(one_layer_model, daemon) as (engine, source):
        prompt = random_tokens(150, seed=5)  # 38 too many: chunks 0 (but the sinks) to 2 go
        answer, first = await run_turn(engine, prompt, source)
        assert (first.truncated_tokens, first.reused_tokens) == (3 * CHUNK_TOKENS - SINK_TOKENS, 0)
        # Chunks 3..9 of prompt + answer, and chunk 0, computed whole after the turn.
        assert first.saved_chunks == 7 + 1
        await engine.drain_saves()

        # Turn 2 (169 + 16 tokens) must drop chunk 3 too; it reuses the sinks and chunks 4..9.
        prompt = prompt + answer + random_tokens(3, seed=6)
        tokens, stats = await run_turn(engine, prompt, source, truncated_tokens=first.truncated_tokens)
        assert stats.truncated_tokens == 4 * CHUNK_TOKENS - SINK_TOKENS
        assert stats.reused_tokens == SINK_TOKENS + 6 * CHUNK_TOKENS and stats.fallback is None
        reference, _ = await run_turn(
            engine, Truncation(SINK_TOKENS, stats.truncated_tokens).kept(prompt), None
        )
        assert tokens == reference
        await engine.drain_saves()
