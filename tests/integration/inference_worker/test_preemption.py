"""Preemption through the store: four turns on a pool too small for them all (tiny Llama,
a real daemon). A preempted turn's computed chunks are saved, its blocks freed, and it
resumes by loading them back; every turn still decodes the 32 greedy tokens it decodes
alone. With the daemon killed, preempted turns recompute instead and still answer."""

from __future__ import annotations

import asyncio

import pytest
import torch

from attnstore.errors import ResourceExhausted
from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import LoadedModel
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource, SamplingParams, TokenEvent, TurnInput, TurnStats
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(240)

ANSWER_TOKENS = 32
CHUNK_TOKENS = 16
POOL_BLOCKS = 12  # one turn needs up to 6 blocks of 16 tokens, four need 24


def settings(model: LoadedModel) -> WorkerSettings:
    block_bytes = CHUNK_TOKENS * ModelGeometry.of(model.config).kv_bytes_per_token(4)  # fp32
    return WorkerSettings(
        chunk_tokens=CHUNK_TOKENS, block_tokens=CHUNK_TOKENS, kv_memory_bytes=POOL_BLOCKS * block_bytes
    )


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (50, 41, 57, 35)]


async def run_turn(engine: TurnEngine, prompt: list[int], source: KVSource | None) -> list[int]:
    turn = TurnInput(prompt, SamplingParams(max_tokens=ANSWER_TOKENS), save_generated=False)
    events = [event async for event in engine.run_turn(turn, source)]
    assert isinstance(events[-1], TurnStats) and events[-1].generated_tokens == ANSWER_TOKENS
    return [event.token_id for event in events if isinstance(event, TokenEvent)]


async def alone(model: LoadedModel) -> list[list[int]]:
    engine = TurnEngine(model, None, settings(model))
    try:
        return [await run_turn(engine, prompt, None) for prompt in prompts()]
    finally:
        await engine.close()


@pytest.mark.parametrize("daemon_alive", [True, False], ids=["resumed-from-store", "daemon-killed"])
async def test_preempted_turns_resume_with_identical_output(
    tiny_model: LoadedModel, daemon: DaemonProcess, daemon_alive: bool
) -> None:
    expected = await alone(tiny_model)
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(tiny_model, client, settings(tiny_model))
        source = await engine.namespace_for(b"preemption")
        if not daemon_alive:
            daemon.kill9()
        try:
            got = await asyncio.gather(*(run_turn(engine, prompt, source) for prompt in prompts()))
            await engine.drain_saves()
        finally:
            await engine.close()
    assert got == expected
    assert engine.engine.stats.preemptions > 0
    if daemon_alive:
        assert engine.prefiller.resumed_from_store > 0
    else:
        assert engine.prefiller.resumed_from_store == 0
    assert engine.engine.pool.usage().used == 0


async def test_a_prompt_larger_than_the_pool_is_refused_and_the_engine_goes_on(
    tiny_model: LoadedModel,
) -> None:
    engine = TurnEngine(tiny_model, None, settings(tiny_model))
    try:
        with pytest.raises(ResourceExhausted, match="KV pool of 12 blocks"):
            await run_turn(engine, list(range(POOL_BLOCKS * CHUNK_TOKENS + 1)), None)
        assert len(await run_turn(engine, prompts()[0], None)) == ANSWER_TOKENS
    finally:
        await engine.close()
