"""The worker's pool as the first cache level (pool_keeps_freed_prefixes), against a real
daemon on a tiny random-weight Llama: a turn whose prefix chunks the pool still holds
asks the daemon for none of them (its lookup and read counters do not move), a turn whose
first chunks are in the pool and the next ones only on the daemon loads just those
(written after the pool's blocks, at their positions), and both decode what full
recomputation decodes. Without the setting the daemon serves the whole prefix."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from turn_events import collect_turn, random_tokens

from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.model_store import LoadedModel
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource, SamplingParams, TurnInput, TurnStats
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(120)

CHUNK_TOKENS = 16
ANSWER_TOKENS = 8
MiB = 1024 * 1024


def settings(pool_keeps_freed_prefixes: bool) -> WorkerSettings:
    return WorkerSettings(
        chunk_tokens=CHUNK_TOKENS,
        block_tokens=CHUNK_TOKENS,
        kv_memory_bytes=16 * MiB,
        pool_keeps_freed_prefixes=pool_keeps_freed_prefixes,
    )


async def run_turn(
    engine: TurnEngine, prompt: Sequence[int], source: KVSource | None
) -> tuple[list[int], TurnStats]:
    turn = TurnInput(list(prompt), SamplingParams(max_tokens=ANSWER_TOKENS), save_generated=False)
    answer = await collect_turn(engine.run_turn(turn, source))
    await engine.drain_saves()
    return answer


async def counters(client: AsyncKVStoreClient) -> tuple[int, int]:
    """(chunks the daemon found, keys it missed) over lookups and reads since start."""
    stats = await client.stats()
    return stats.dram.hits + stats.ssd.hits, stats.misses


async def counted_turn(
    client: AsyncKVStoreClient,
    engine: TurnEngine,
    prompt: Sequence[int],
    source: KVSource,
    recompute: TurnEngine,
) -> tuple[list[int], TurnStats, tuple[int, int], list[int]]:
    """The turn's tokens and stats; what it asked of the daemon (chunks found, keys missed);
    and the tokens `recompute` decodes from the same prompt without stored KV."""
    before = await counters(client)
    tokens, stats = await run_turn(engine, prompt, source)
    after = await counters(client)
    reference, _ = await run_turn(recompute, prompt, None)
    return tokens, stats, (after[0] - before[0], after[1] - before[1]), reference


@pytest.mark.parametrize("pool_keeps_freed_prefixes", [True, False], ids=["pool-first", "daemon-only"])
async def test_chunks_the_pool_holds_are_not_asked_of_the_daemon(
    tiny_model: LoadedModel, daemon: DaemonProcess, pool_keeps_freed_prefixes: bool
) -> None:
    first = random_tokens(70, seed=1)  # 4 full chunks, saved and kept in the pool
    second = first + random_tokens(30, seed=2)  # 6 reusable chunks: 4 known, 2 new
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(tiny_model, client, settings(pool_keeps_freed_prefixes))
        try:
            source = await engine.namespace_for(b"tenant")
            _, stats = await run_turn(engine, first, source)
            assert stats.saved_chunks == 4
            tokens, stats, (found, missed), reference = await counted_turn(
                client, engine, second, source, engine
            )
        finally:
            await engine.close()
    assert tokens == reference and stats.fallback is None
    assert stats.reused_tokens == 4 * CHUNK_TOKENS
    if pool_keeps_freed_prefixes:
        assert stats.reused_dram_chunks == 0
        assert (found, missed) == (0, 2)  # asked only for chunks 4 and 5, which are not stored
    else:
        assert stats.reused_dram_chunks == 4
        assert found >= 4 and missed == 2  # looked up (and read) chunks 0-3 too


async def test_the_daemon_serves_only_the_chunks_after_the_pools(
    tiny_model: LoadedModel, daemon: DaemonProcess
) -> None:
    long = random_tokens(100, seed=3)  # 6 reusable chunks
    async with AsyncKVStoreClient(daemon.address) as client:
        saver = TurnEngine(tiny_model, client, settings(False))  # another worker: the daemon gets 0-3
        pooled = TurnEngine(tiny_model, client, settings(True))  # this one's pool gets 0-1
        try:
            source = await saver.namespace_for(b"tenant")
            assert (await run_turn(saver, long[:70], source))[1].saved_chunks == 4
            assert (await pooled.namespace_for(b"tenant")) == source
            await run_turn(pooled, long[:40], source)  # loads chunks 0-1 into its pool
            tokens, stats, (found, missed), reference = await counted_turn(
                client, pooled, long, source, saver
            )
        finally:
            await saver.close()
            await pooled.close()
    assert tokens == reference and stats.fallback is None
    assert stats.reused_tokens == 4 * CHUNK_TOKENS and stats.reused_dram_chunks == 2
    assert missed == 2  # chunks 4-5: missed by the lookup
    assert 2 <= found <= 4  # chunks 2-3 only: looked up, then read
