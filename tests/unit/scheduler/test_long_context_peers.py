"""Each turn names the worker's peers for DistAttention (ExecuteTurnRequest.
long_context_peers): the other healthy workers, the least busy first, at most the
configured count, never the worker itself."""

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

ADDRESSES = ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4")  # nothing listens there


@pytest.fixture
async def registry() -> AsyncIterator[WorkerRegistry]:
    made = WorkerRegistry(
        max_turns_per_worker=2, health_interval_seconds=60, health_timeout_seconds=1, daemon_timeout_seconds=1
    )
    made.set_topology([NodeSpec(name="a", worker_addresses=ADDRESSES)])
    for worker in made.workers():
        worker.healthy, worker.model = True, ModelCard(max_new_tokens=8)
    yield made
    await made.close()


def test_peers_are_the_other_healthy_workers_least_busy_first(registry: WorkerRegistry) -> None:
    first, second, third, fourth = registry.workers()
    third.in_flight = 1
    fourth.healthy = False
    assert registry.peer_addresses(first, 16) == [second.address, third.address]
    assert registry.peer_addresses(first, 1) == [second.address]
    assert registry.peer_addresses(first, 0) == []


async def test_each_attempt_names_the_peers_of_its_worker(registry: WorkerRegistry) -> None:
    requests: list[tuple[WorkerHandle, TurnRequest]] = []

    async def prepare(worker: WorkerHandle) -> TurnRequest:
        request = TurnRequest("t", TokenIds((1,)), SamplingParams(max_tokens=1))
        requests.append((worker, request))
        return request

    dispatcher = Dispatcher(JobQueue(16), registry)
    loop = asyncio.create_task(dispatcher.run())
    runner = TurnRunner(
        dispatcher, registry, retry_attempts=0, attempt_timeout_seconds=5, long_context_peers=2
    )
    try:
        with pytest.raises(Unavailable):  # nothing listens: the attempt fails after sending
            async with asyncio.timeout(10):
                async for _ in runner.run(TurnSpec(tenant="t", session_id="s", prepare=prepare, node="a")):
                    pass
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    sent = [(worker.address, list(request.long_context_peers)) for worker, request in requests]
    assert len(sent) == 1
    address, peers = sent[0]
    assert len(peers) == 2 and address not in peers and set(peers) < set(ADDRESSES)
