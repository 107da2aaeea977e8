"""The predictive policy's prefetch never holds a store: a reserve that needs DRAM room
gets it before any promotion of predicted chunks begins. In process (the daemon's
ChunkStore on real DRAM and SSD tiers), so the test orders events on the store's own event
loop rather than racing a gRPC client; one SSD thread, as under load, queues every tier
copy in turn. A promotion that did not wait made room (which the reserve took) and read
its chunk while the reserve's demotions ran, yet mostly finished after the reserve: so
the test counts the SSD reads begun (the tier's test double), not the promotions done."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from faulty_ssd_tier import FaultySsdTier
from prometheus_client import REGISTRY

from kvstore_daemon.chunk_entry import ReserveResult, TierName
from kvstore_daemon.chunk_store import ChunkStore
from kvstore_daemon.dram_tier import DramTier
from kvstore_daemon.hints import HintAction, HintSpec
from kvstore_daemon.namespaces import NamespaceLayout, NamespaceRegistry
from kvstore_daemon.settings import DaemonSettings

if TYPE_CHECKING:  # the fixtures' types; conftest modules are not imported by name
    from conftest import ChunkSet

KiB = 1024
BLOCK_BYTES = 256 * KiB
SHAPE = {"num_layers": 7, "kv_heads": 4, "head_dim": 128, "chunk_tokens": 64}  # 900 KiB: 4 blocks
DRAM_CHUNKS, STORED, NEW = 8, 20, 4  # 12 stored chunks on SSD; predicted soon, 4 fit the prefetch share
POLLS = 200  # 10 s of 50 ms polls for the prefetch to finish


def _tier(store: ChunkStore, chunks: ChunkSet, index: int) -> TierName:
    return store.lookup(chunks.namespace, [chunks.key(index)], promote=False)[0]


def _promotions() -> float:
    return REGISTRY.get_sample_value("attnstore_kvstore_promotions_total") or 0.0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ChunkStore]:
    settings = DaemonSettings(
        shm_dir=tmp_path / "shm",
        ssd_dirs=[tmp_path / "ssd"],
        io_threads=1,
        eviction_policy="predictive",
        dram_block_bytes=BLOCK_BYTES,
        max_chunk_bytes=1024 * KiB,
        persist_on_commit=False,
        dram_capacity_bytes=DRAM_CHUNKS * 4 * BLOCK_BYTES,
        dram_high_watermark=1.0,
        dram_low_watermark=1.0,
        predictive_prefetch_dram_share=0.5,  # off by default
    )
    (tmp_path / "shm").mkdir()
    dram = DramTier(settings.shm_dir, settings.dram_capacity_bytes, settings.dram_block_bytes)
    ssd = FaultySsdTier(settings.ssd_dirs, settings.ssd_capacity_bytes, settings.io_threads)
    namespaces = NamespaceRegistry(
        tmp_path / "ssd" / "namespaces.msgpack", 4, settings.max_chunk_bytes, 3600.0
    )
    chunk_store = ChunkStore(settings, dram, ssd, namespaces)
    await chunk_store.start()
    yield chunk_store
    await ssd.close()
    dram.close()


async def _put(store: ChunkStore, chunks: ChunkSet, indices: range) -> None:
    """As a client: reserve, write the bytes into the arena, commit."""
    await _write(store, chunks, indices, await _reserve(store, chunks, indices))


async def _reserve(store: ChunkStore, chunks: ChunkSet, indices: range) -> list[ReserveResult]:
    return await store.reserve(
        chunks.namespace, [(chunks.key(i), len(chunks.data(i))) for i in indices], 60.0
    )


async def _write(store: ChunkStore, chunks: ChunkSet, indices: range, reserved: list[ReserveResult]) -> None:
    for result, i in zip(reserved, indices, strict=True):
        store.dram.arena.write(result.extents, 0, chunks.data(i))
    await store.commit([r.write_id for r in reserved], durable=False)


async def test_a_reserve_gets_dram_room_before_a_predicted_prefetch_moves_anything(
    store: ChunkStore, chunk_set: type[ChunkSet]
) -> None:
    chunks = chunk_set(**SHAPE)
    store.register_namespace(chunks.namespace, NamespaceLayout(**chunks.layout), "test")
    for i in range(STORED):
        await _put(store, chunks, range(i, i + 1))
    on_ssd = [i for i in range(STORED) if _tier(store, chunks, i) is TierName.SSD]
    assert len(on_ssd) == STORED - DRAM_CHUNKS

    # The SSD chunks are predicted in seconds, the DRAM ones in minutes: prefetch moves up to half of DRAM.
    predictions = [
        HintSpec([chunks.key(i)], HintAction.PREDICT, 0, 1.0 + i if i in on_ssd else 600.0)
        for i in range(STORED)
    ]
    promotions = _promotions()
    _, started = store.hint(chunks.namespace, predictions, replace=True, ttl_seconds=600.0)
    assert started == NEW
    # A turn's store arrives with the push: all its keys get room before any prefetch begins.
    assert isinstance(store.ssd, FaultySsdTier)
    reads, turn = store.ssd.reads_started, range(STORED, STORED + NEW)
    reserved = await _reserve(store, chunks, turn)
    assert store.ssd.reads_started == reads
    await _write(store, chunks, turn, reserved)
    assert _promotions() == promotions
    assert store.stats().dram_chunks == DRAM_CHUNKS

    # Then the prefetch goes on: the soonest predicted chunks reach DRAM.
    for _ in range(POLLS):  # a poll, not a timing: it waits for progress
        if _promotions() == promotions + NEW:
            break
        await asyncio.sleep(0.05)
    assert _promotions() == promotions + NEW
    assert _tier(store, chunks, on_ssd[0]) is TierName.DRAM
