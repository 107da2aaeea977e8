"""Routing and admission: the registry's choice of worker (affinity, else least load,
never a failed or full one) and the dispatcher handing out slots in queue order."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import pytest

from attnstore_scheduler.dispatcher import Dispatcher
from attnstore_scheduler.job_queue import JobQueue, QueuedJob
from attnstore_scheduler.settings import NodeSpec
from attnstore_scheduler.worker_registry import WorkerRegistry
from attnstore_scheduler.worker_types import ModelCard

_ids = itertools.count()


@pytest.fixture
async def registry() -> AsyncIterator[WorkerRegistry]:
    """Two nodes, three workers, all healthy with a model card (no server behind them:
    routing never calls a worker)."""
    made = WorkerRegistry(
        max_turns_per_worker=2, health_interval_seconds=60, health_timeout_seconds=1, daemon_timeout_seconds=1
    )
    made.set_topology(
        [
            NodeSpec(name="a", worker_addresses=("127.0.0.1:1", "127.0.0.1:2")),
            NodeSpec(name="b", worker_addresses=("127.0.0.1:3",)),
        ]
    )
    for worker in made.workers():
        worker.healthy, worker.model = True, ModelCard(max_new_tokens=8)
    try:
        yield made
    finally:
        await made.close()


def job(node: str | None = None, session_id: str | None = None) -> QueuedJob:
    number = next(_ids)
    return QueuedJob(
        job_id=f"job-{number}",
        tenant="acme",
        session_id=session_id or f"s{number}",
        priority=0,
        chunk_keys=(),
        namespace=b"",
        kv_bytes=0,
        node=node,
        enqueued_at=time.monotonic(),
    )


def test_affinity_first_then_the_least_loaded_worker(registry: WorkerRegistry) -> None:
    taken = [registry.acquire("b") for _ in range(4)]
    assert [(slot[0].node, slot[1]) for slot in taken if slot is not None] == [
        ("b", "affinity"),
        ("b", "affinity"),  # b's one worker takes two turns
        ("a", "load"),
        ("a", "load"),
    ]
    assert len({slot[0].address for slot in taken[2:] if slot is not None}) == 2  # spread over a's two


def test_failed_excluded_and_full_workers_are_skipped(registry: WorkerRegistry) -> None:
    a1, a2, b = registry.workers()
    registry.mark_failed(b)
    acquired = registry.acquire("b", exclude=[a1])
    assert acquired is not None and acquired[0] is a2 and acquired[1] == "load"
    registry.acquire(None, exclude=[a1])
    assert not registry.has_room(exclude=[a1])  # a2 is full, b failed
    registry.release(a2)
    assert registry.has_room(exclude=[a1])


async def test_the_dispatcher_hands_out_slots_as_workers_free_up(registry: WorkerRegistry) -> None:
    queue = JobQueue(64)
    dispatcher = Dispatcher(queue, registry)
    dispatcher_task = asyncio.get_running_loop().create_task(dispatcher.run())
    try:
        slots = [await dispatcher.admit(job("a")) for _ in range(6)]
        assert [slot.route for slot in slots] == ["affinity"] * 4 + ["load"] * 2
        assert sum(worker.in_flight for worker in registry.workers()) == 6

        waiting = asyncio.ensure_future(dispatcher.admit(job("b")))
        await asyncio.sleep(0.05)
        assert not waiting.done() and len(queue) == 1  # every worker is full
        dispatcher.finish(slots[0])  # a slot on node a frees up
        slot = await asyncio.wait_for(waiting, 1)
        assert (slot.worker.node, slot.route) == ("a", "load") and len(queue) == 0

        cancelled = asyncio.ensure_future(dispatcher.admit(job()))
        await asyncio.sleep(0.05)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert len(queue) == 0  # a caller that leaves takes its job out of the queue
    finally:
        dispatcher_task.cancel()
        await asyncio.gather(dispatcher_task, return_exceptions=True)
