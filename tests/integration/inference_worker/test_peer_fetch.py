"""A worker whose KV its daemon placed on a pool peer reads it from that peer itself
(issue 21): two real daemons on loopback stand for two nodes. The borrower's tiers are
too small, so turn 1's chunks end on the lender; turn 2's Lookup names the lender, the
worker streams those chunks layer-major over the lender's data plane (not through its
own daemon, which would promote them), and its logits and tokens are recomputation's.
When the lender dies, the turn recomputes: misses, never wrong KV."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from filler_chunks import write_filler
from running_daemon import running_daemon
from service_probes import free_port
from test_turn_reuse import (
    CHUNK_TOKENS,
    SAVED_CHUNKS,
    first_turn,
    prefill_matches_recompute,
    run_turn,
    turn_matches_recompute,
)

from attnstore.chunks.keys import chunk_key_chain
from attnstore.kvstore_client import AsyncKVStoreClient, Tier
from inference_worker.model_store import LoadedModel
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(120)

KiB = 1024
MiB = 1024 * KiB
FILLER_NAMESPACE = b"peer-fetch-fill!"
FILLER_CHUNKS = 96  # of 16 KiB: more than the borrower's DRAM (8 blocks) and SSD (64 chunks) hold
SMALL_TIERS = {
    "DRAM_BLOCK_BYTES": 128 * KiB,
    "MAX_CHUNK_BYTES": 512 * KiB,
    "SSD_RESERVED_BYTES": 0,
    "EVICTION_POLICY": "lru",
}


@pytest.fixture
def lender(tmp_path: Path) -> Iterator[DaemonProcess]:
    with running_daemon(
        tmp_path / "lender",
        dram_bytes=64 * MiB,
        ssd_bytes=64 * MiB,
        settings={"DATA_PLANE_PORT": free_port()},
    ) as process:
        yield process


@pytest.fixture
def borrower(tmp_path: Path, lender: DaemonProcess) -> Iterator[DaemonProcess]:
    settings = {
        **SMALL_TIERS, "DATA_PLANE_PORT": free_port(), "POOL_PEERS": [lender.address],
        "POOL_CAPACITY_BYTES": 64 * MiB,
    }  # fmt: skip
    with running_daemon(tmp_path / "borrower", dram_bytes=MiB, ssd_bytes=MiB, settings=settings) as process:
        yield process


async def push_to_peer(
    client: AsyncKVStoreClient, engine: TurnEngine, source: KVSource, prompt: list[int]
) -> list[bytes]:
    """Fills the borrower with other chunks until turn 1's chunks live only on the lender."""
    geometry = engine.runner.geometry
    await write_filler(
        client, FILLER_NAMESPACE, FILLER_CHUNKS, num_layers=geometry.num_layers, kv_heads=geometry.kv_heads,
        head_dim=geometry.head_dim, chunk_tokens=CHUNK_TOKENS, dtype="float32", seed=3,
    )  # fmt: skip
    turn_keys = chunk_key_chain(source.namespace, prompt, CHUNK_TOKENS)[:SAVED_CHUNKS]
    for _ in range(100):  # placement finishes in the background of the evicting write
        found = await client.lookup(source.namespace, turn_keys)
        if found.tiers == [Tier.PEER] * SAVED_CHUNKS:  # evicted from DRAM and SSD, kept on the peer
            return turn_keys
        await asyncio.sleep(0.1)
    raise AssertionError(f"turn 1's chunks never all moved to the peer: {found}")


async def test_the_worker_reads_peer_chunks_from_the_peer_and_matches_recompute(
    tiny_model: LoadedModel, lender: DaemonProcess, borrower: DaemonProcess
) -> None:
    async with AsyncKVStoreClient(borrower.address, use_shm=False) as client:  # "another node": no arena
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
        source = await engine.namespace_for(b"tenant-a")
        prompt = await first_turn(engine, source)
        turn_keys = await push_to_peer(client, engine, source, prompt)
        assert (await client.lookup(source.namespace, turn_keys)).peers == [lender.address] * SAVED_CHUNKS

        await prefill_matches_recompute(engine, prompt, source)
        stats = client.client_stats()
        assert stats.peers == {lender.address: "dataplane"} and stats.reads["peer"] >= 1
        # Read from the lender, not through the borrower: had the borrower served them, it
        # would have promoted them into its DRAM.
        assert (await client.lookup(source.namespace, turn_keys)).tiers == [Tier.PEER] * SAVED_CHUNKS

        await turn_matches_recompute(engine, prompt, source)
        await engine.drain_saves()


async def test_a_dead_peer_costs_a_recompute_not_wrong_tokens(
    tiny_model: LoadedModel, lender: DaemonProcess, borrower: DaemonProcess
) -> None:
    async with AsyncKVStoreClient(borrower.address, use_shm=False) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
        source = await engine.namespace_for(b"tenant-a")
        prompt = await first_turn(engine, source)
        await push_to_peer(client, engine, source, prompt)
        lender.kill9()
        tokens, turn = await run_turn(engine, prompt, source)
        reference, _ = await run_turn(engine, prompt, None)
        assert tokens == reference and turn.fallback is not None and turn.reused_tokens == 0
        await engine.drain_saves()
