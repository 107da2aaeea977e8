"""Eight turns at once on one worker engine, through a real daemon (tiny Llama, fp32): two
extend stored conversations and load their KV, two share a system prompt, one overflows
the context window and is truncated, the rest differ in length; prefill runs in chunks
mixed with the others' decodes. Each decodes the 32 greedy tokens it decodes alone on an
engine without a cache, and they shared forward passes."""

from __future__ import annotations

import asyncio

import pytest
from turn_events import collect_turn, random_tokens

from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.model_store import LoadedModel
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource, SamplingParams, TurnInput, TurnStats
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(240)

ANSWER_TOKENS = 32
SETTINGS = WorkerSettings(
    chunk_tokens=16,
    max_context_tokens=160,
    attention_sink_tokens=4,
    max_batch_tokens=48,  # prefills span several steps, beside the decodes
    kv_memory_bytes=64 * 1024 * 1024,
)


async def run_turn(
    engine: TurnEngine, prompt: list[int], source: KVSource | None, history_tokens: int = 0
) -> tuple[list[int], TurnStats]:
    turn = TurnInput(prompt, SamplingParams(max_tokens=ANSWER_TOKENS), history_tokens=history_tokens)
    return await collect_turn(engine.run_turn(turn, source))


async def test_eight_concurrent_turns_decode_what_each_decodes_alone(
    tiny_model: LoadedModel, daemon: DaemonProcess
) -> None:
    system = random_tokens(30, seed=10)
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(tiny_model, client, SETTINGS)
        source = await engine.namespace_for(b"batched")
        histories = []
        for seed, length in ((1, 40), (2, 50)):  # two conversations' first turns, stored
            prompt = random_tokens(length, seed)
            answer, _ = await run_turn(engine, prompt, source)
            histories.append(prompt + answer)
        await engine.drain_saves()
        turns = [
            (histories[0] + random_tokens(10, 3), len(histories[0])),
            (histories[1] + random_tokens(5, 4), len(histories[1])),
            (system + random_tokens(9, 5), 0),
            (system + random_tokens(21, 6), 0),
            (random_tokens(7, 7), 0),
            (random_tokens(60, 8), 0),
            (random_tokens(150, 9), 0),  # 150 + 32 > 160: truncated
            (random_tokens(2, 11), 0),
        ]
        together = await asyncio.gather(*(run_turn(engine, p, source, h) for p, h in turns))
        assert engine.engine.stats.max_batch_sequences >= 4
        await engine.drain_saves()
        await engine.close()

    alone_engine = TurnEngine(tiny_model, None, SETTINGS)
    try:
        for (prompt, _), (tokens, stats) in zip(turns, together, strict=True):
            alone, alone_stats = await run_turn(alone_engine, prompt, None)
            assert tokens == alone, f"a {len(prompt)}-token turn decoded differently in the batch"
            assert (stats.truncated_tokens, stats.sink_tokens) == (
                alone_stats.truncated_tokens,
                alone_stats.sink_tokens,
            )
    finally:
        await alone_engine.close()
    stats = [s for _, s in together]
    assert stats[0].reused_tokens > 0 and stats[1].reused_tokens > 0 and stats[0].fallback is None
    assert stats[6].truncated_tokens > 0 and stats[6].sink_tokens == 4
