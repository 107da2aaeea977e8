"""Admits turns to workers in queue order (job_queue.JobQueue: priorities, per-tenant
fairness) and routes each one (worker_registry: affinity, else least load).

A caller `admit`s its job and waits; the dispatch loop pops the first job some worker has
room for and hands the caller a Slot on that worker; the caller runs the turn and
`finish`es the slot. Jobs between admission and finish are the "running" ones (the
look-ahead planner leaves them out: see lookahead.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

import structlog

from attnstore_scheduler import metrics
from attnstore_scheduler.job_queue import JobQueue, QueuedJob
from attnstore_scheduler.worker_registry import WorkerHandle, WorkerRegistry

log = structlog.get_logger("attnstore_scheduler.dispatcher")


@dataclass(frozen=True)
class Slot:
    """A turn's place on a worker, held from admission until `finish`."""

    job: QueuedJob
    worker: WorkerHandle
    route: Literal["affinity", "load", "retry"]
    waited_seconds: float


@dataclass
class _Waiter:
    future: asyncio.Future[Slot]
    exclude: Collection[WorkerHandle]  # workers that already failed this turn
    retry: bool


class Dispatcher:
    def __init__(self, queue: JobQueue, registry: WorkerRegistry) -> None:
        self._queue = queue
        self._registry = registry
        self._waiters: dict[str, _Waiter] = {}  # by job id
        self._running: set[str] = set()  # ids of the admitted jobs not finished yet
        registry.add_listener(queue.wake)  # a freed slot may let a refused job run
        queue.add_listener(lambda: metrics.QUEUE_LENGTH.set(len(queue)))

    async def admit(
        self, job: QueuedJob, *, exclude: Collection[WorkerHandle] = (), retry: bool = False
    ) -> Slot:
        """Queues `job` and waits for a worker; QueueFull when the queue is at its limit."""
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._queue.push(job)
        self._waiters[job.job_id] = _Waiter(future, exclude, retry)
        try:
            return await future
        except BaseException:  # the caller went away: give back whatever it held
            self._waiters.pop(job.job_id, None)
            self._queue.remove(job.job_id)
            if future.done() and not future.cancelled():
                self.finish(future.result())
            raise

    def finish(self, slot: Slot) -> None:
        if slot.job.job_id in self._running:
            self._running.remove(slot.job.job_id)
            self._registry.release(slot.worker)

    async def run(self) -> None:
        """The dispatch loop: runs until cancelled."""
        while True:
            job = await self._queue.pop(self._has_room)
            waiter = self._waiters.pop(job.job_id, None)
            if waiter is None or waiter.future.done():
                continue  # its caller left between push and pop
            acquired = self._registry.acquire(job.node, waiter.exclude)
            if acquired is None:  # cannot happen: _has_room said yes and nothing ran since
                waiter.future.set_exception(RuntimeError("no worker had room for an accepted job"))
                continue
            worker, route = acquired
            waited = time.monotonic() - job.enqueued_at
            slot = Slot(job, worker, "retry" if waiter.retry else route, waited)
            self._running.add(job.job_id)
            metrics.ROUTES.labels(slot.route).inc()
            metrics.QUEUE_WAIT_SECONDS.observe(waited)
            log.debug("dispatched", job=job.job_id, worker=worker.address, route=slot.route, waited=waited)
            waiter.future.set_result(slot)

    def _has_room(self, job: QueuedJob) -> bool:
        waiter = self._waiters.get(job.job_id)
        return self._registry.has_room(waiter.exclude if waiter is not None else ())
