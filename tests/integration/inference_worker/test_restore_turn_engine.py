"""Turns that save and restore hidden states (HCache) through a real daemon: a random-weight
multi-head Llama (its hidden states are half the bytes of its KV) whose worker stores layer 0
as nothing, layer 1 as hidden states and layer 2 as KV. Turn 1 saves restore chunks; turn 2
restores them with the planner's mixed plan (recompute 1, project 1, load 1) and gives what
full recomputation gives; preempted turns resume from restore chunks. The default path (a
grouped-query model) builds no policy."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import REGISTRY

from attnstore.chunks.format import LayerForm
from attnstore.chunks.keys import chunk_key_chain
from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.layerwise_cache import PrefixKV
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import LoadedModel, load_model
from inference_worker.restore.loader import RestoreStats
from inference_worker.restore.planner import RestoreCosts, TierCosts
from inference_worker.restore.policy import RestorePolicy, worker_policy
from inference_worker.restore.settings import RestoreSettings
from inference_worker.restore.storage_plan import StoragePlan
from inference_worker.servicer import stats_message
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource, SamplingParams, TokenEvent, TurnInput, TurnStats
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(120)

CHUNK_TOKENS = 16
FIRST_PROMPT_TOKENS = 40
ANSWER_TOKENS = 32
NEW_TOKENS = 20
SAVED_CHUNKS = (FIRST_PROMPT_TOKENS + ANSWER_TOKENS - 1) // CHUNK_TOKENS  # full ones; a partial one follows
LAYERS = 3
STORAGE = StoragePlan(LAYERS, recompute_layers=1, hidden_layers=1)  # NONE, HIDDEN, KV
# Reading and projecting are nearly free, recomputing is dear: the planner recomputes only
# the layer that is not stored, projects the hidden one and loads the KV one.
COSTS = RestoreCosts(
    project_seconds=1e-9,
    recompute_seconds=1.0,
    recompute_pair_seconds=0.0,
    tiers={"dram": TierCosts(1e-9, 1e-9), "ssd": TierCosts(1e-9, 1e-9)},
)
SAVED_METRIC = "attnstore_worker_restore_stored_bytes_saved_total"
PLANS_METRIC = "attnstore_worker_restore_plans_total"
MHA_LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,  # multi-head attention: hidden states are half of K and V
    "max_position_embeddings": 1024,
    "initializer_range": 0.2,
}


@pytest.fixture(scope="module")
def mha_model(tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path]) -> LoadedModel:
    directory = tiny_model_saver(tmp_path_factory.mktemp("mha-llama"), **MHA_LLAMA)
    return load_model(directory, torch.float32, "cpu")


def random_tokens(count: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def restore_plans_counted() -> float:
    return sum(
        REGISTRY.get_sample_value(PLANS_METRIC, {"method": method}) or 0.0
        for method in ("recompute", "hidden", "kv", "mix")
    )


async def execute(
    engine: TurnEngine, turn: TurnInput, source: KVSource | None
) -> tuple[list[int], TurnStats]:
    """The turn's tokens and stats."""
    events = [event async for event in engine.run_turn(turn, source)]
    stats = events.pop()
    assert isinstance(stats, TurnStats)
    return [event.token_id for event in events if isinstance(event, TokenEvent)], stats


async def run_turn(
    engine: TurnEngine, prompt: Sequence[int], source: KVSource | None
) -> tuple[list[int], TurnStats]:
    turn = TurnInput(list(prompt), SamplingParams(max_tokens=ANSWER_TOKENS), history_tokens=len(prompt))
    return await execute(engine, turn, source)


async def test_second_turn_restores_hidden_states_with_a_mixed_plan(
    mha_model: LoadedModel, daemon: DaemonProcess
) -> None:
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(
            mha_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS), RestorePolicy(COSTS, STORAGE)
        )
        try:
            source = await engine.namespace_for(b"tenant-a")
            kv_engine = TurnEngine(mha_model, None, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
            assert source != await kv_engine.namespace_for(b"tenant-a")  # the plan is in the namespace
            await kv_engine.close()

            first = random_tokens(FIRST_PROMPT_TOKENS, seed=1)
            saved_before = REGISTRY.get_sample_value(SAVED_METRIC) or 0.0
            answer, stats = await run_turn(engine, first, source)
            assert stats.saved_chunks == SAVED_CHUNKS and stats.reused_tokens == 0 and not stats.restore_plan
            await engine.drain_saves()
            # r1h1k1 stores per token 0 + hidden + 2 x hidden values instead of 3 x 2 x hidden,
            # for the full chunks and the partial one after them (all but the last token)
            saved_tokens = FIRST_PROMPT_TOKENS + len(answer) - 1
            saved_bytes = saved_tokens * 3 * MHA_LLAMA["hidden_size"] * 4
            assert REGISTRY.get_sample_value(SAVED_METRIC) - saved_before == saved_bytes
            keys = chunk_key_chain(source.namespace, first + answer, CHUNK_TOKENS)[:SAVED_CHUNKS]
            async for piece in client.iter_layers(source.namespace, keys[:1]):
                header = piece.layout.header  # restore chunks: one form per layer
                assert header.layer_forms == (LayerForm.NONE, LayerForm.HIDDEN, LayerForm.KV)
                assert header.hidden_size == MHA_LLAMA["hidden_size"]

            prompt = first + answer + random_tokens(NEW_TOKENS, seed=2)
            cached = await engine.prefiller.prefill(prompt, source)
            recomputed = await engine.prefiller.prefill(prompt, None)
            assert cached.reused_tokens == SAVED_CHUNKS * CHUNK_TOKENS and cached.fallback is None
            assert cached.restore_plan == "r1h1k1"
            assert (cached.logits - recomputed.logits).abs().max().item() <= 1e-4

            tokens, stats = await run_turn(engine, prompt, source)
            reference, reference_stats = await run_turn(engine, prompt, None)
            assert tokens == reference and len(tokens) == ANSWER_TOKENS
            assert stats.restore_plan == "r1h1k1" and stats.fallback is None
            assert stats.reused_tokens == SAVED_CHUNKS * CHUNK_TOKENS
            assert all(stats.restore_seconds[method] > 0 for method in ("recompute", "hidden", "kv"))
            message = stats_message(stats)  # what the worker's ExecuteTurn sends
            assert message.restore_plan == "r1h1k1"
            assert message.restore_hidden_ms == pytest.approx(stats.restore_seconds["hidden"] * 1000)
            assert message.restore_recompute_ms > 0 and message.restore_kv_ms > 0
            # It saves the chunks it computed (not the restored ones), as restore chunks again.
            assert stats.saved_chunks == (len(prompt) + ANSWER_TOKENS - 1) // CHUNK_TOKENS - SAVED_CHUNKS
            assert reference_stats.restore_plan == "" and reference_stats.reused_tokens == 0
            assert not reference_stats.restore_seconds
            await engine.drain_saves()
            third, third_stats = await run_turn(engine, prompt + tokens, source)
            # its full chunks and the partial one after them: all of its history but the last token
            assert third_stats.reused_tokens == len(prompt) + ANSWER_TOKENS - 1
            assert third_stats.restore_plan == "r1h1k1" and third_stats.fallback is None
            assert third == (await run_turn(engine, prompt + tokens, None))[0]
        finally:
            await engine.close()


def test_the_default_policy_keeps_kv(tiny_model: LoadedModel, mha_model: LoadedModel) -> None:
    """Grouped-query models (auto) and `off` build no policy, so turns store KV as before."""
    assert worker_policy(tiny_model.model, RestoreSettings(), 4) is None
    assert worker_policy(mha_model.model, RestoreSettings(hidden_states="off"), 4) is None


async def test_a_history_ending_inside_a_chunk_is_restored_and_that_chunk_saved_whole(
    mha_model: LoadedModel, daemon: DaemonProcess
) -> None:
    """Turn 1 saves its full chunks and the partial chunk after them as restore chunks.
    Turn 2, told where the history ends, restores all of it with the mixed plan (the logits
    (1e-4) and greedy tokens of recomputation) and saves the chunk holding the old tail
    whole, the tail's restored hidden states with what it computed; turn 3 restores that
    chunk to recomputation's logits too."""
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(
            mha_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS), RestorePolicy(COSTS, STORAGE)
        )
        try:
            source = await engine.namespace_for(b"tails")
            prompt = random_tokens(FIRST_PROMPT_TOKENS, seed=8)
            answer, _ = await run_turn(engine, prompt, source)
            for seed in (9, 10):  # turns 2 and 3
                await engine.drain_saves()
                history = len(prompt) + len(answer)
                prompt = prompt + answer + random_tokens(NEW_TOKENS, seed=seed)
                answer = await restored_turn(engine, prompt, source, history)
        finally:
            await engine.close()


async def restored_turn(engine: TurnEngine, prompt: list[int], source: KVSource, history: int) -> list[int]:
    """A turn whose `history` tokens end inside a chunk: every one but the last (never
    computed) restored, as recomputation gives; it saves every full chunk from the one
    holding the tail on. Its greedy tokens."""
    assert (history - 1) % CHUNK_TOKENS  # the history's last chunk is partial
    cached = await engine.prefiller.prefill(prompt, source, history_tokens=history)
    recomputed = await engine.prefiller.prefill(prompt, None)
    assert cached.fallback is None and cached.restore_plan == "r1h1k1"
    assert cached.reused_tokens == history - 1
    assert (cached.logits - recomputed.logits).abs().max().item() <= 1e-4
    turn = TurnInput(prompt, SamplingParams(max_tokens=ANSWER_TOKENS), history_tokens=history)
    tokens, stats = await execute(engine, turn, source)
    assert stats.reused_tokens == history - 1
    assert tokens == (await run_turn(engine, prompt, None))[0]
    saved_tokens = len(prompt) + len(tokens) - 1
    assert stats.saved_chunks == saved_tokens // CHUNK_TOKENS - (history - 1) // CHUNK_TOKENS
    return tokens


async def truncated_turn(
    engine: TurnEngine, prompt: list[int], source: KVSource | None, truncated_tokens: int
) -> tuple[list[int], TurnStats]:
    turn = TurnInput(prompt, SamplingParams(max_tokens=8), truncated_tokens=truncated_tokens)
    return await execute(engine, turn, source)


async def test_truncated_turns_restore_their_sinks_and_kept_chunks(
    mha_model: LoadedModel, daemon: DaemonProcess
) -> None:
    """A 96-token window, 4 sinks, chunks of 16. Turn 1 (90 + 8 tokens) drops 12 tokens and
    saves chunk 0 whole for its sinks and its kept chunks 1-5 (at positions 4..) as restore
    chunks. Turn 2, truncated alike, restores the sinks and chunks 1-5 with the mixed plan:
    the same logits (1e-4) and greedy tokens as recomputing its kept tokens. Turn 3 drops
    more: its kept chunks are restored 32 positions earlier (hidden states projected there,
    KV rotated there)."""
    settings = WorkerSettings(chunk_tokens=CHUNK_TOKENS, max_context_tokens=96, attention_sink_tokens=4)
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(mha_model, client, settings, RestorePolicy(COSTS, STORAGE))
        try:
            source = await engine.namespace_for(b"truncated")
            first = random_tokens(90, seed=5)
            answer, stats = await truncated_turn(engine, first, source, 0)
            assert stats.truncated_tokens == 12 and stats.reused_tokens == 0
            await engine.drain_saves()
            keys = chunk_key_chain(source.namespace, first + answer, CHUNK_TOKENS)
            found = await client.lookup(source.namespace, keys)
            assert found.prefix_length == 6  # chunk 0 for the sinks, the kept chunks 1-5
            async for piece in client.iter_layers(source.namespace, keys[:2]):
                assert piece.layout.header.layer_forms == STORAGE.forms  # restore chunks, the sinks' too
                assert piece.layout.header.base_position == (0, 4)[piece.chunk_index]

            prompt = first + answer + random_tokens(2, seed=6)
            truncation = engine.window.plan(len(prompt), 8, 12)
            assert truncation.dropped_tokens == 12
            cached = await engine.prefiller.prefill(prompt, source, truncation)
            recomputed = await engine.prefiller.prefill(prompt, None, truncation)
            assert cached.fallback is None and cached.restore_plan == "r1h1k1"
            assert cached.reused_tokens == 4 + 5 * CHUNK_TOKENS
            assert (cached.logits - recomputed.logits).abs().max().item() <= 1e-4
            tokens, stats = await truncated_turn(engine, prompt, source, 12)
            assert tokens == (await truncated_turn(engine, prompt, None, 12))[0]
            assert stats.restore_plan == "r1h1k1" and stats.reused_tokens == 4 + 5 * CHUNK_TOKENS

            third = prompt + tokens + random_tokens(20, seed=7)
            _, stats = await truncated_turn(engine, third, source, 12)
            assert stats.truncated_tokens == 44  # chunks 1 and 2 dropped: 3-5 move 32 positions back
            assert stats.fallback is None and stats.restore_plan == "r1h1k1"
            assert stats.reused_tokens == 4 + 3 * CHUNK_TOKENS
        finally:
            await engine.close()


async def test_preempted_turns_resume_from_restore_chunks_with_identical_output(
    mha_model: LoadedModel, daemon: DaemonProcess
) -> None:
    """Four turns on a pool too small for them all: a preempted turn's computed chunks are
    saved as restore chunks (the storage plan's forms, its captured hidden states), restored
    on its next admission with the planner's plan, and every turn decodes the greedy tokens it
    decodes alone."""
    block_bytes = CHUNK_TOKENS * ModelGeometry.of(mha_model.config).kv_bytes_per_token(4)
    settings = WorkerSettings(
        chunk_tokens=CHUNK_TOKENS, block_tokens=CHUNK_TOKENS, kv_memory_bytes=12 * block_bytes
    )  # a turn needs up to 6 blocks, four need 24
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (50, 41, 57, 35)]
    alone = TurnEngine(mha_model, None, settings)
    try:
        expected = [(await run_turn(alone, prompt, None))[0] for prompt in prompts]
    finally:
        await alone.close()
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(mha_model, client, settings, RestorePolicy(COSTS, STORAGE))
        assert engine.restore is not None
        restored: list[PrefixKV] = []  # every restore's prefix (the real restore, recorded)
        restore = engine.restore.restore

        async def recorded(*args: Any) -> RestoreStats:
            restored.append(args[3])
            return await restore(*args)

        engine.restore.restore = recorded  # type: ignore[method-assign]
        plans_before = restore_plans_counted()
        try:
            source = await engine.namespace_for(b"preemption")
            got = await asyncio.gather(*(run_turn(engine, prompt, source) for prompt in prompts))
            await engine.drain_saves()
        finally:
            await engine.close()
    assert [tokens for tokens, _ in got] == expected
    assert engine.engine.stats.preemptions > 0 and engine.prefiller.resumed_from_store > 0
    # the resumed turns' restores (the only ones: the prompts share no chunks) all arrived whole
    assert len(restored) == engine.prefiller.resumed_from_store
    assert all(prefix.load_seconds is not None for prefix in restored)
    # ... and counted: in the metrics, and in the costs (a real projection costs more than 1 ns)
    assert restore_plans_counted() - plans_before == engine.prefiller.resumed_from_store
    assert engine.restore.policy.costs.project_seconds > COSTS.project_seconds
    assert engine.engine.pool.usage().used == 0
