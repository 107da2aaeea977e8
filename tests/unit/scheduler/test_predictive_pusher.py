"""Two scheduler replicas push predictions (HintPusher with a SessionActivity, each its own
source) to one real daemon on the predictive policy: both replicas' sessions stay
protected, and what neither predicts is evicted first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hint_daemon import CHUNKS_PER_SESSION, NS, MiB, Target, hint_store, session_keys, tiers

from attnstore.chunks.format import encode_chunk
from attnstore.kvstore_client import AsyncKVStoreClient, Tier
from attnstore_scheduler.hint_pusher import HintPusher
from attnstore_scheduler.job_queue import JobQueue
from attnstore_scheduler.lookahead import NodeCapacity
from attnstore_scheduler.session_activity import SessionActivity
from attnstore_scheduler.settings import HintSettings


@pytest.fixture
async def kv(tmp_path: Path) -> AsyncIterator[AsyncKVStoreClient]:
    async with hint_store(tmp_path, "predictive") as client:
        yield client


async def put(kv: AsyncKVStoreClient, session: int) -> None:
    half = 32 * 256 * 2
    await kv.put_chunks(
        NS,
        {
            key: encode_chunk(
                namespace=NS,
                key=key,
                dtype="float16",
                kv_heads=1,
                tokens=32,
                head_dim=256,
                base_position=0,
                layers=[(bytes(half), bytes(half))],
            )
            for key in session_keys(session)
        },
    )


def replica(kv: AsyncKVStoreClient, name: str, sessions: list[int]) -> HintPusher:
    activity = SessionActivity()
    for session in sessions:
        activity.turn_started(f"s{session}", "node0", NS, now=0.0)
        activity.turn_ended(f"s{session}", session_keys(session), now=1.0)
    target = Target("node0", kv, NodeCapacity(MiB, 16 * MiB))
    return HintPusher(
        JobQueue(16), lambda: [target], HintSettings(), clock=lambda: 2.0, activity=activity, source=name
    )


async def test_both_replicas_sessions_stay_protected(kv: AsyncKVStoreClient) -> None:
    first, second = replica(kv, "scheduler-0", [0, 1]), replica(kv, "scheduler-1", [2])
    for session in (0, 1, 2, 9):  # DRAM is full: 16 chunks
        await put(kv, session)
    await first.push()
    await second.push()  # its replace must not forget the first replica's predictions
    await put(kv, 10)  # four chunks must go: session 9's, which no replica predicts
    assert await tiers(kv, 9) == [Tier.SSD] * CHUNKS_PER_SESSION
    for session in (0, 1, 2):
        assert await tiers(kv, session) == [Tier.DRAM] * CHUNKS_PER_SESSION
