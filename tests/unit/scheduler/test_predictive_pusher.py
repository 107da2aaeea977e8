"""Two scheduler replicas push predictions (HintPusher with a SessionActivity, each its own
source) to one real daemon on the predictive policy: both replicas' sessions stay
protected, and what neither predicts is evicted first."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from running_daemon import running_daemon

from attnstore.chunks.format import encode_chunk
from attnstore.chunks.keys import chunk_key
from attnstore.kvstore_client import AsyncKVStoreClient, Tier
from attnstore_scheduler.hint_pusher import HintPusher
from attnstore_scheduler.job_queue import JobQueue
from attnstore_scheduler.lookahead import NodeCapacity
from attnstore_scheduler.session_activity import SessionActivity
from attnstore_scheduler.settings import HintSettings
from kvstore_daemon.launcher import DaemonProcess

KiB, MiB = 1024, 1024 * 1024
NS = bytes(range(16))
LAYOUT = {"num_layers": 1, "kv_heads": 1, "head_dim": 256, "chunk_tokens": 32, "dtype": "float16"}
BLOCK_BYTES = 64 * KiB  # one chunk per block: DRAM holds 16 chunks
CHUNKS = 4  # per session
DAEMON_SETTINGS = {
    "dram_block_bytes": BLOCK_BYTES, "max_chunk_bytes": BLOCK_BYTES, "eviction_policy": "predictive",
    "persist_on_commit": "false", "dram_high_watermark": 1.0, "dram_low_watermark": 1.0, "log_level": "WARNING",
}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with running_daemon(tmp_path, dram_bytes=MiB, ssd_bytes=16 * MiB, settings=DAEMON_SETTINGS) as process:
        yield process


@pytest.fixture
async def kv(daemon: DaemonProcess) -> AsyncIterator[AsyncKVStoreClient]:
    async with AsyncKVStoreClient(daemon.address) as client:
        await client.register_namespace(NS, **LAYOUT)
        yield client


@dataclass
class Target:
    node: str
    client: AsyncKVStoreClient
    capacity: NodeCapacity | None


def keys_of(session: int) -> list[bytes]:
    keys: list[bytes] = []
    for index in range(CHUNKS):
        keys.append(chunk_key(NS, keys[-1] if keys else None, range(1000 * session + index, 1000 * session + index + 32)))
    return keys


async def put(kv: AsyncKVStoreClient, session: int) -> None:
    half = 32 * 256 * 2
    await kv.put_chunks(NS, {key: encode_chunk(namespace=NS, key=key, dtype="float16", kv_heads=1, tokens=32,
                                               head_dim=256, base_position=0, layers=[(bytes(half), bytes(half))])
                             for key in keys_of(session)})


def replica(kv: AsyncKVStoreClient, name: str, sessions: list[int]) -> HintPusher:
    activity = SessionActivity()
    for session in sessions:
        activity.turn_started(f"s{session}", "node0", NS, now=0.0)
        activity.turn_ended(f"s{session}", keys_of(session), now=1.0)
    target = Target("node0", kv, NodeCapacity(MiB, 16 * MiB))
    return HintPusher(JobQueue(16), lambda: [target], HintSettings(), clock=lambda: 2.0, activity=activity,
                      source=name)


async def tiers(kv: AsyncKVStoreClient, session: int) -> list[Tier]:
    return [(await kv.lookup(NS, [key])).tiers[0] for key in keys_of(session)]


async def test_both_replicas_sessions_stay_protected(kv: AsyncKVStoreClient) -> None:
    first, second = replica(kv, "scheduler-0", [0, 1]), replica(kv, "scheduler-1", [2])
    for session in (0, 1, 2, 9):  # DRAM is full: 16 chunks
        await put(kv, session)
    await first.push()
    await second.push()  # its replace must not forget the first replica's predictions
    await put(kv, 10)  # four chunks must go: session 9's, which no replica predicts
    assert await tiers(kv, 9) == [Tier.SSD] * CHUNKS
    for session in (0, 1, 2):
        assert await tiers(kv, session) == [Tier.DRAM] * CHUNKS
