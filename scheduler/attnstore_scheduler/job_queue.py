"""The scheduler's job queue: strict priorities, fair turns between tenants within a
priority, and the predicted service order that look-ahead planning reads.

Order: a higher `priority` always runs first. Within one priority, start-time fair
queuing with one unit of cost per job: a job's tag is the later of the queue's virtual
time (the tag of the job served last) and its tenant's previous tag plus one. Tenants
therefore take turns, and a tenant's burst of a hundred jobs waits behind the single
jobs of the others instead of starving them. Equal tags keep arrival order.

`snapshot()` is the order `pop()` serves the waiting jobs in if nothing else arrives and
every job is accepted: the look-ahead window that the hint pusher turns into prefetch and
eviction hints.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from attnstore.errors import AlreadyExists, ResourceExhausted

_OrderKey = tuple[int, int, int]  # (-priority, fair-queuing tag, arrival number)


@dataclass
class QueuedJob:
    job_id: str
    tenant: str
    session_id: str
    priority: int  # higher runs first
    chunk_keys: tuple[bytes, ...]  # the stored KV the job will read, oldest chunk first
    namespace: bytes  # 16-byte namespace of chunk_keys
    kv_bytes: int  # bytes of the chunks in chunk_keys
    node: str | None  # node whose daemon holds the session's KV; None: no affinity yet
    enqueued_at: float  # seconds on the scheduler's clock (for wait-time metrics)


class QueueFull(ResourceExhausted):
    """The queue holds its maximum number of jobs; the caller should shed load."""


class DuplicateJob(AlreadyExists):
    """A job with this id is already queued."""


@dataclass
class _Level:
    """Fair-queuing state of one priority: virtual time and each waiting tenant's last tag."""

    virtual_time: int = 0
    last_tag: dict[str, int] = field(default_factory=dict)
    waiting: Counter[str] = field(default_factory=Counter)


class JobQueue:
    """Asyncio job queue; every method runs on the event loop thread."""

    def __init__(self, max_length: int) -> None:
        if max_length < 1:
            raise ValueError(f"max_length must be positive, got {max_length}")
        self.max_length = max_length
        self._order: list[_OrderKey] = []  # sorted: the predicted service order
        self._jobs: dict[int, QueuedJob] = {}  # by arrival number
        self._key_of: dict[str, _OrderKey] = {}  # by job id
        self._levels: dict[int, _Level] = {}  # by priority
        self._arrivals = itertools.count()
        self._changed = asyncio.Event()  # replaced on every change, so each waiter sees it once
        self._listeners: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._key_of

    def add_listener(self, callback: Callable[[], None]) -> None:
        """`callback()` runs after every push, pop and remove (e.g. the hint pusher's notify)."""
        self._listeners.append(callback)

    def push(self, job: QueuedJob) -> None:
        """Queues `job`; QueueFull at max_length, DuplicateJob if its id is queued."""
        if len(self._order) >= self.max_length:
            raise QueueFull(f"the job queue holds its maximum of {self.max_length} jobs; retry later")
        if job.job_id in self._key_of:
            raise DuplicateJob(f"job {job.job_id!r} is already queued")
        level = self._levels.setdefault(job.priority, _Level())
        tag = max(level.virtual_time, level.last_tag.get(job.tenant, level.virtual_time - 1) + 1)
        level.last_tag[job.tenant] = tag
        level.waiting[job.tenant] += 1
        key = (-job.priority, tag, next(self._arrivals))
        bisect.insort(self._order, key)
        self._jobs[key[2]] = job
        self._key_of[job.job_id] = key
        self._changed_now()

    async def pop(self, accept: Callable[[QueuedJob], bool] | None = None) -> QueuedJob:
        """The first job in service order that `accept` takes (any job without `accept`),
        waiting until there is one. A session's jobs run in order: once `accept` refuses a
        job, later jobs of the same session are not offered. Call `wake()` when what
        `accept` answers may have changed (a worker became free)."""
        while True:
            changed = self._changed
            job = self._take(accept)
            if job is not None:
                return job
            await changed.wait()

    def remove(self, job_id: str) -> bool:
        """Drops a waiting job (cancelled by its caller); False if it is not queued."""
        key = self._key_of.get(job_id)
        if key is None:
            return False
        self._drop(key)
        self._changed_now()
        return True

    def snapshot(self) -> list[QueuedJob]:
        """The waiting jobs in predicted service order (next to run first)."""
        return [self._jobs[key[2]] for key in self._order]

    def wake(self) -> None:
        """Makes waiting `pop` calls ask their `accept` again; the queue itself is unchanged."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _take(self, accept: Callable[[QueuedJob], bool] | None) -> QueuedJob | None:
        refused_sessions: set[str] = set()
        for key in self._order:
            job = self._jobs[key[2]]
            if job.session_id in refused_sessions:
                continue
            if accept is None or accept(job):
                level = self._levels[job.priority]
                level.virtual_time = max(level.virtual_time, key[1])
                self._drop(key)
                self._changed_now()
                return job
            refused_sessions.add(job.session_id)
        return None

    def _drop(self, key: _OrderKey) -> None:
        del self._order[bisect.bisect_left(self._order, key)]
        job = self._jobs.pop(key[2])
        del self._key_of[job.job_id]
        level = self._levels[job.priority]
        level.waiting[job.tenant] -= 1
        if not level.waiting[job.tenant]:
            # A tenant with nothing waiting rejoins at the virtual time: no credit, no debt.
            del level.waiting[job.tenant]
            del level.last_tag[job.tenant]
        if not level.waiting:
            del self._levels[job.priority]

    def _changed_now(self) -> None:
        self.wake()
        for callback in self._listeners:
            callback()
