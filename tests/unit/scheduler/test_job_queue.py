"""The job queue: priorities, fair turns between tenants, accept filters, remove, the
predicted order, QueueFull, and waking waiters."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnstore_scheduler.job_queue import DuplicateJob, JobQueue, QueuedJob, QueueFull

_ids = itertools.count()


def job(
    tenant: str = "t", priority: int = 0, session: str | None = None, node: str | None = None
) -> QueuedJob:
    number = next(_ids)
    return QueuedJob(
        job_id=f"{tenant}-{number}",
        tenant=tenant,
        session_id=session or f"s{number}",
        priority=priority,
        chunk_keys=(),
        namespace=b"n" * 16,
        kv_bytes=0,
        node=node,
        enqueued_at=0.0,
    )


async def drain(queue: JobQueue) -> list[QueuedJob]:
    return [await queue.pop() for _ in range(len(queue))]


async def test_higher_priority_runs_first_and_ties_keep_arrival_order() -> None:
    queue = JobQueue(64)
    low, high, high2, mid = job(priority=0), job(priority=5), job(priority=5), job(priority=1)
    for item in (low, high, high2, mid):
        queue.push(item)
    assert await drain(queue) == [high, high2, mid, low]


async def test_a_tenants_burst_does_not_starve_the_others() -> None:
    queue = JobQueue(64)
    burst = [job("bulk") for _ in range(10)]
    for item in burst:
        queue.push(item)
    others = [job("alice"), job("bob")]
    for item in others:
        queue.push(item)
    order = [item.tenant for item in await drain(queue)]
    # Each tenant's first job runs in the first round; the burst's rest follows.
    assert order[:4] == ["bulk", "alice", "bob", "bulk"]
    assert order[4:] == ["bulk"] * 8


async def test_a_newcomer_joins_the_current_round_while_a_burst_is_served() -> None:
    queue = JobQueue(64)
    for _ in range(6):
        queue.push(job("bulk"))
    await queue.pop()
    await queue.pop()
    late = job("late")
    queue.push(late)  # bulk's next job has tag 2; the newcomer gets the current virtual time, 1
    assert queue.snapshot()[0] is late
    assert await queue.pop() is late


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 2)), min_size=1, max_size=40))
async def test_predicted_order_is_the_service_order_and_is_fair(pushes: list[tuple[str, int]]) -> None:
    queue = JobQueue(64)
    jobs = [job(tenant, priority) for tenant, priority in pushes]
    for item in jobs:
        queue.push(item)
    predicted = queue.snapshot()
    served = await drain(queue)
    assert served == predicted and sorted(j.job_id for j in served) == sorted(j.job_id for j in jobs)
    assert [j.priority for j in served] == sorted((j.priority for j in jobs), reverse=True)
    for priority in {j.priority for j in jobs}:
        level = [j for j in served if j.priority == priority]
        # FIFO within a tenant
        for tenant in {j.tenant for j in level}:
            assert [j for j in level if j.tenant == tenant] == [
                j for j in jobs if j.tenant == tenant and j in level
            ]
        # Fair: while two tenants both wait, their served counts differ by at most one.
        totals = Counter(j.tenant for j in level)
        counts: Counter[str] = Counter()
        for item in level:
            counts[item.tenant] += 1
            waiting = [t for t in totals if counts[t] < totals[t]]
            assert all(abs(counts[a] - counts[b]) <= 1 for a in waiting for b in waiting)


async def test_remove_drops_a_waiting_job_only_once() -> None:
    queue = JobQueue(64)
    first, second, third = job(), job(), job()
    for item in (first, second, third):
        queue.push(item)
    assert queue.remove(second.job_id) is True
    assert queue.remove(second.job_id) is False
    assert second.job_id not in queue and first.job_id in queue
    assert queue.snapshot() == [first, third] and len(queue) == 2
    assert await drain(queue) == [first, third]
    assert queue.remove("never-queued") is False


async def test_a_full_queue_raises_queue_full_and_duplicates_are_refused() -> None:
    queue = JobQueue(max_length=2)
    first = job()
    queue.push(first)
    with pytest.raises(DuplicateJob):
        queue.push(first)
    queue.push(job())
    with pytest.raises(QueueFull):
        queue.push(job())
    await queue.pop()
    queue.push(job())  # room again
    assert len(queue) == 2


async def test_accept_skips_jobs_it_cannot_place_and_keeps_a_sessions_order() -> None:
    queue = JobQueue(64)
    turn1, turn2 = job("a", session="s1", node="busy"), job("a", session="s1", node="free")
    other = job("b", node="free")
    for item in (turn1, turn2, other):
        queue.push(item)
    # turn2 could be placed, but turn1 of the same session must run first.
    assert await queue.pop(lambda j: j.node == "free") is other
    assert queue.snapshot() == [turn1, turn2]


async def test_pop_waits_for_a_push_and_wake_reevaluates_accept() -> None:
    queue = JobQueue(64)
    waiter = asyncio.create_task(queue.pop())
    await asyncio.sleep(0)
    assert not waiter.done()
    pushed = job()
    queue.push(pushed)
    assert await asyncio.wait_for(waiter, 5) is pushed

    free: set[str] = set()
    queue.push(placed := job(node="n1"))
    picky = asyncio.create_task(queue.pop(lambda j: j.node in free))
    await asyncio.sleep(0)
    assert not picky.done()
    free.add("n1")
    queue.wake()
    assert await asyncio.wait_for(picky, 5) is placed


async def test_listeners_hear_every_change() -> None:
    queue = JobQueue(64)
    calls: list[int] = []
    queue.add_listener(lambda: calls.append(len(queue)))
    first = job()
    queue.push(first)
    queue.push(job())
    queue.remove(first.job_id)
    await queue.pop()
    queue.wake()  # not a change of contents
    assert calls == [1, 2, 1, 0]


def test_max_length_must_be_positive() -> None:
    with pytest.raises(ValueError):
        JobQueue(max_length=0)
