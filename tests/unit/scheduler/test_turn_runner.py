"""A turn whose worker fails is replayed on another worker; with no other worker there,
it fails at once with UNAVAILABLE instead of waiting in the queue for the caller's
deadline (its replay may never run on the worker that failed it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from attnstore.errors import Unavailable
from attnstore_scheduler.dispatcher import Dispatcher
from attnstore_scheduler.job_queue import JobQueue
from attnstore_scheduler.settings import NodeSpec
from attnstore_scheduler.turn_runner import TurnRunner, TurnSpec
from attnstore_scheduler.worker_registry import WorkerHandle, WorkerRegistry
from attnstore_scheduler.worker_types import ModelCard, SamplingParams, TokenIds, TurnRequest


@pytest.fixture
async def registry() -> AsyncIterator[WorkerRegistry]:
    """One healthy worker at an address where nothing listens: every call to it fails."""
    made = WorkerRegistry(
        max_turns_per_worker=2, health_interval_seconds=60, health_timeout_seconds=1, daemon_timeout_seconds=1
    )
    made.set_topology([NodeSpec(name="a", worker_addresses=("127.0.0.1:1",))])
    [worker] = made.workers()
    worker.healthy, worker.model = True, ModelCard(max_new_tokens=8)
    yield made
    await made.close()


async def prepare(worker: WorkerHandle) -> TurnRequest:
    return TurnRequest("t", TokenIds((1,)), SamplingParams(max_tokens=1))


async def test_a_failed_turn_with_no_other_worker_fails_at_once(registry: WorkerRegistry) -> None:
    dispatcher = Dispatcher(JobQueue(16), registry)
    loop = asyncio.create_task(dispatcher.run())
    runner = TurnRunner(dispatcher, registry, retry_attempts=2, attempt_timeout_seconds=5)
    try:
        with pytest.raises(Unavailable, match=r"the turn failed on 1 worker\(s\); last error: UNAVAILABLE"):
            async with asyncio.timeout(10):  # without the check it waits for a worker forever
                async for _ in runner.run(TurnSpec(tenant="t", session_id="s", prepare=prepare, node="a")):
                    pass
        assert [worker.in_flight for worker in registry.workers()] == [0]  # its slot was given back
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
