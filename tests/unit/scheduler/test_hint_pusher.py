"""The hint pusher: against a real daemon process (lookahead policy) that prefetches what
the queue needs and evicts what Sessions released first, rate limiting, an unreachable
daemon, stale namespaces, split calls."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from async_polling import wait_until
from hint_daemon import (
    BLOCK_BYTES,
    CHUNKS_PER_SESSION,
    LAYOUT,
    NS,
    MiB,
    Target,
    hint_daemon,
    registered_client,
    session_keys,
    tiers,
)
from hypothesis import given
from hypothesis import strategies as st

from attnstore.chunks.format import encode_chunk
from attnstore.kvstore_client import AsyncKVStoreClient, HintAction, HintResult, Tier
from attnstore_scheduler.hint_pusher import HintClient, HintPusher, capacity_from_stats, split_entries
from attnstore_scheduler.job_queue import JobQueue, QueuedJob
from attnstore_scheduler.lookahead import HintEntry, NodeCapacity
from attnstore_scheduler.session_record import SessionRecord
from attnstore_scheduler.session_store import EmbeddedSessionStore
from attnstore_scheduler.sessions import Sessions
from attnstore_scheduler.settings import HintSettings, NodeSpec
from attnstore_scheduler.worker_registry import WorkerRegistry
from kvstore_daemon.launcher import DaemonProcess

NS2 = bytes(range(1, 17))
QUEUE_LENGTH = 64
_ids = itertools.count()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with hint_daemon(tmp_path, "lookahead") as process:
        yield process


@pytest.fixture
async def client(daemon: DaemonProcess) -> AsyncIterator[AsyncKVStoreClient]:
    async with registered_client(daemon) as kv:
        yield kv


def chunk(key: bytes) -> bytes:
    half = LAYOUT["kv_heads"] * LAYOUT["chunk_tokens"] * LAYOUT["head_dim"] * 2
    return encode_chunk(
        namespace=NS,
        key=key,
        dtype="float16",
        kv_heads=1,
        tokens=32,
        head_dim=256,
        base_position=0,
        layers=[(key * (half // 32), key * (half // 32))],
    )


def job(session: int, node: str = "up", namespace: bytes = NS) -> QueuedJob:
    return QueuedJob(
        job_id=f"j{next(_ids)}",
        tenant="t",
        session_id=f"s{session}",
        priority=0,
        chunk_keys=tuple(session_keys(session)),
        namespace=namespace,
        kv_bytes=CHUNKS_PER_SESSION * BLOCK_BYTES,
        node=node,
        enqueued_at=0.0,
    )


@dataclass
class RecordingClient:
    """Delegates to a real client (or fails like a dead daemon when `inner` is None) and
    records each call as (namespace, keys, replace)."""

    inner: HintClient | None = None
    calls: list[tuple[bytes, int, bool]] = field(default_factory=list)
    actions: list[dict[bytes, HintAction]] = field(default_factory=list)  # per call: key -> action

    async def hint(
        self,
        namespace: bytes,
        entries: Sequence[tuple[Sequence[bytes], HintAction, int, float]],
        *,
        replace: bool = False,
        ttl_seconds: int = 0,
        source: str = "",
    ) -> HintResult:
        self.calls.append((namespace, sum(len(entry[0]) for entry in entries), replace))
        self.actions.append({key: entry[1] for entry in entries for key in entry[0]})
        if self.inner is None:
            return HintResult(hinted_keys=0, prefetches_started=0)
        return await self.inner.hint(
            namespace, entries, replace=replace, ttl_seconds=ttl_seconds, source=source
        )


async def test_prefetch_hints_move_the_queued_sessions_from_ssd_to_dram(client: AsyncKVStoreClient) -> None:
    for session in range(6):  # 24 chunks into a 16-chunk DRAM: sessions 0 and 1 go to SSD
        await client.put_chunks(NS, {key: chunk(key) for key in session_keys(session)})
    assert await tiers(client, 0) == await tiers(client, 1) == [Tier.SSD] * 4
    assert await tiers(client, 2) == [Tier.DRAM] * 4
    queue = JobQueue(QUEUE_LENGTH)
    for session in (0, 1, 2):  # 768 KiB of KV: inside the 80% of 1 MiB prefetch window
        queue.push(job(session))
    capacity = await capacity_from_stats(client)
    assert capacity == NodeCapacity(dram_bytes=MiB, ssd_bytes=16 * MiB)
    pusher = HintPusher(queue, lambda: [Target("up", client, capacity)], HintSettings())

    report = await pusher.push()

    assert report.nodes_pushed == ["up"] and report.nodes_failed == []
    assert report.hinted_keys == 12 and report.prefetches_started == 8

    async def queued_sessions_in_dram() -> bool:
        return [await tiers(client, s) for s in (0, 1, 2)] == [[Tier.DRAM] * 4] * 3

    await wait_until(queued_sessions_in_dram, "the prefetch of sessions 0 and 1")
    # Room came from unhinted chunks, least recently used first: sessions 3 and 4.
    assert await tiers(client, 3) == await tiers(client, 4) == [Tier.SSD] * 4
    stats = await client.stats()
    assert stats.promotions == 8 and stats.eviction_policy == "lookahead"


async def test_a_released_sessions_chunks_are_still_evicted_first_after_the_next_push(
    daemon: DaemonProcess, client: AsyncKVStoreClient
) -> None:
    """Sessions releases through the pusher: its EVICT_FIRST rides along with every replace
    push (a hint of its own, as Sessions used to send, was wiped by the next one)."""
    for session in range(6):  # 24 chunks into a 16-chunk DRAM: sessions 2 to 5 stay in DRAM
        await client.put_chunks(NS, {key: chunk(key) for key in session_keys(session)})
    assert await tiers(client, 2) == await tiers(client, 5) == [Tier.DRAM] * 4
    registry = WorkerRegistry(
        max_turns_per_worker=1, health_interval_seconds=1, health_timeout_seconds=1, daemon_timeout_seconds=5
    )
    registry.set_topology(
        [NodeSpec(name="up", daemon_address=daemon.address, worker_addresses=("unused:1",))]
    )
    queue = JobQueue(QUEUE_LENGTH)
    queue.push(job(3))  # a queued turn in the namespace: every push replaces its hints there
    pusher = HintPusher(queue, lambda: [Target("up", client, NodeCapacity(MiB, 16 * MiB))], HintSettings())
    sessions = Sessions(EmbeddedSessionStore(1.0), registry, pusher, max_sessions_per_tenant=10)
    ended = SessionRecord(
        tenant="t", session_id="5" * 32, ttl_seconds=60, created_at=0.0, updated_at=0.0,
        namespace=NS, chunk_keys=tuple(session_keys(5)), node="up",
    )  # fmt: skip
    try:
        assert await sessions.release(ended) == CHUNKS_PER_SESSION
        await pusher.push()
        await pusher.push()  # the next push replaces the namespace's hints again
        await client.put_chunks(NS, {key: chunk(key) for key in session_keys(6)})  # 4 chunks must go
    finally:
        await registry.close()
    assert await tiers(client, 5) == [Tier.SSD] * 4  # the released session went first...
    assert await tiers(client, 2) == [Tier.DRAM] * 4  # ...not the least recently used one


async def test_pushes_are_rate_limited_and_the_last_one_carries_the_final_queue(
    client: AsyncKVStoreClient,
) -> None:
    queue = JobQueue(QUEUE_LENGTH)
    recorder = RecordingClient(client)
    pusher = HintPusher(
        queue,
        lambda: [Target("up", recorder, NodeCapacity(MiB, 16 * MiB))],
        HintSettings(min_interval_seconds=0.5),
    )
    runner = asyncio.create_task(pusher.run())
    try:
        started = time.monotonic()
        for session in range(20):  # 20 changes within about 0.4 s
            queue.push(job(session % 3))
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.7)  # past the interval: the trailing change is pushed
        elapsed = time.monotonic() - started
    finally:
        runner.cancel()
    assert 2 <= pusher.pushes <= 2 + elapsed / 0.5
    assert recorder.calls[-1] == (NS, 3 * CHUNKS_PER_SESSION, True)  # 3 distinct sessions queued


async def test_an_unreachable_daemon_is_counted_and_the_others_still_get_their_hints(
    client: AsyncKVStoreClient,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead_address = f"127.0.0.1:{probe.getsockname()[1]}"
    queue = JobQueue(QUEUE_LENGTH)
    queue.push(job(0, node="up"))
    queue.push(job(1, node="down"))
    queue.push(job(2, node="down", namespace=NS2))
    async with AsyncKVStoreClient(dead_address, timeout_seconds=2.0) as dead:
        capacity = NodeCapacity(MiB, 16 * MiB)
        targets = [Target("up", client, capacity), Target("down", dead, capacity), Target("new", dead, None)]
        pusher = HintPusher(queue, lambda: targets, HintSettings())
        for attempt in (1, 2):  # the failed node is retried by the next push
            report = await pusher.push()
            assert report.nodes_pushed == ["up"] and report.nodes_failed == ["down"]
            assert pusher.failures == {"down": attempt}  # one per push: its second namespace is skipped
            assert report.hinted_keys == CHUNKS_PER_SESSION


async def test_a_namespace_that_leaves_the_window_is_replaced_by_nothing() -> None:
    queue = JobQueue(QUEUE_LENGTH)
    recorder = RecordingClient()
    target = Target("n", recorder, NodeCapacity(MiB, MiB))
    pusher = HintPusher(queue, lambda: [target], HintSettings(max_keys_per_call=3))
    first = job(0, node="n", namespace=NS2)
    queue.push(first)
    await pusher.push()
    assert recorder.calls == [(NS2, 3, True), (NS2, 1, False)]  # 4 keys in calls of at most 3
    queue.remove(first.job_id)
    await pusher.push()
    assert recorder.calls[2:] == [(NS2, 0, True)]
    await pusher.push()
    assert recorder.calls[3:] == []  # nothing left to clear


async def test_released_chunks_are_hinted_evict_first_with_every_push_until_their_time_is_up() -> None:
    queue = JobQueue(QUEUE_LENGTH)
    recorder = RecordingClient()
    now = [0.0]
    target = Target("n", recorder, NodeCapacity(MiB, MiB))
    pusher = HintPusher(queue, lambda: [target], HintSettings(release_seconds=30), clock=lambda: now[0])
    queued = job(0, node="n")
    queue.push(queued)
    released = session_keys(1)
    pusher.release("n", NS, [*released, queued.chunk_keys[0]])
    pusher.release("elsewhere", NS, released)  # a node without a target keeps them for later
    await pusher.push()
    sent = recorder.actions[-1]
    assert {key: sent[key] for key in released} == dict.fromkeys(released, HintAction.EVICT_FIRST)
    assert sent[queued.chunk_keys[0]] is HintAction.PREFETCH  # needed by a queued job: its hint wins
    assert recorder.calls[-1] == (NS, 8, True)
    queue.remove(queued.job_id)
    now[0] = 29.0
    await pusher.push()  # replace=true again: the release rides along
    assert recorder.calls[-1] == (NS, 5, True) and set(recorder.actions[-1].values()) == {
        HintAction.EVICT_FIRST
    }
    now[0] = 30.0
    await pusher.push()
    assert recorder.calls[-1] == (NS, 0, True)  # time is up: the namespace is cleared


@given(
    sizes=st.lists(st.integers(1, 9), max_size=8),
    max_keys=st.integers(1, 10),
)
def test_split_entries_keeps_every_key_in_order_within_the_limit(sizes: list[int], max_keys: int) -> None:
    counter = itertools.count()
    entries = [
        HintEntry(tuple(bytes([next(counter)]) for _ in range(size)), HintAction.PROTECT, position)
        for position, size in enumerate(sizes)
    ]
    calls = split_entries(entries, max_keys)
    assert calls and all(sum(len(e.keys) for e in call) <= max_keys for call in calls)
    assert all(call for call in calls) or calls == [[]]
    flat = [(key, e.action, e.queue_position) for call in calls for e in call for key in e.keys]
    assert flat == [(key, e.action, e.queue_position) for e in entries for key in e.keys]
