"""Both session stores behave the same: the embedded one and the Redis one against a real
redis-server. TTLs, expiry claims, paging, the per-tenant limits (sessions, stored tokens),
turn locks granted in arrival order, and saves that never bring a deleted session back."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import redis.asyncio as aioredis
from scheduler_stack import RedisFactory, redis_store

from attnstore.errors import ResourceExhausted, Unavailable
from attnstore_scheduler.redis_schema_store import RedisSchemaStore
from attnstore_scheduler.redis_turn_queue import queue_key
from attnstore_scheduler.session_record import Message, SessionIds, SessionRecord
from attnstore_scheduler.session_store import EmbeddedSessionStore, SessionStore

LOCK_WAIT_SECONDS = 1.0


@pytest.fixture(params=["embedded", "redis"])
async def store(request: pytest.FixtureRequest, redis_factory: RedisFactory) -> AsyncIterator[SessionStore]:
    if request.param == "embedded":
        made: SessionStore = EmbeddedSessionStore(LOCK_WAIT_SECONDS)
    else:
        made = redis_store(redis_factory().url, lock_ttl_seconds=0.6, lock_wait_seconds=LOCK_WAIT_SECONDS)
    try:
        yield made
    finally:
        await made.close()


IDS = SessionIds()  # one maker, so records made in one millisecond still sort by creation


def record(tenant: str = "acme", ttl_seconds: int = 60, **fields: object) -> SessionRecord:
    return replace(SessionRecord.new(IDS, tenant, ttl_seconds), **fields)  # type: ignore[arg-type]


async def test_a_session_round_trips_and_is_invisible_to_other_tenants(store: SessionStore) -> None:
    session = record(
        messages=(
            Message("system", "be brief"),
            Message("user", "hi"),
            Message("assistant", "hello", "stop"),
        ),
        token_ids=(1, 2, 3),
        closing_tokens=1,
        namespace=bytes(16),
        chunk_keys=(bytes(32), b"\x01" * 32),
        truncated_tokens=16,
        sink_tokens=4,
        node="node-a",
        turns=1,
    )
    await store.create(session, 10)

    assert await store.get("acme", session.session_id) == session
    assert await store.get("globex", session.session_id) is None
    assert await store.list("globex", "", 10) == []
    assert await store.delete("globex", session.session_id) is None
    assert await store.get("acme", session.session_id) == session


async def test_save_refreshes_and_never_resurrects_a_deleted_session(store: SessionStore) -> None:
    session = record()
    await store.create(session, 10)
    later = replace(session, turns=1, updated_at=session.updated_at + 5)
    assert await store.save(later)
    assert (await store.get("acme", session.session_id)) == later

    assert await store.delete("acme", session.session_id) == later
    assert not await store.save(replace(later, turns=2))
    assert await store.get("acme", session.session_id) is None


async def test_sessions_expire_after_their_ttl_and_are_claimed_once(store: SessionStore) -> None:
    short, long = record(ttl_seconds=1), record(ttl_seconds=60)
    for session in (short, long):
        await store.create(session, 10)
    assert await store.claim_expired(time.time(), 10) == []

    await asyncio.sleep(1.1)
    assert await store.get("acme", short.session_id) is None  # expired, before any sweep
    assert [s.session_id for s in await store.list("acme", "", 10)] == [long.session_id]
    claimed = await store.claim_expired(time.time(), 10)
    assert [s.session_id for s in claimed] == [short.session_id]
    assert claimed[0].chunk_keys == short.chunk_keys  # what releasing its KV needs
    assert await store.claim_expired(time.time(), 10) == []
    assert await store.get("acme", long.session_id) == long


async def test_a_session_in_a_turn_does_not_expire_under_it(store: SessionStore) -> None:
    session = record(ttl_seconds=1)
    await store.create(session, 10)
    async with store.turn_lock("acme", session.session_id):
        await asyncio.sleep(1.1)
        assert await store.claim_expired(time.time(), 10) == []
        assert await store.save(replace(session, updated_at=time.time()))
    assert await store.claim_expired(time.time(), 10) == []
    assert await store.get("acme", session.session_id) is not None


async def test_listing_pages_by_id_in_creation_order(store: SessionStore) -> None:
    sessions = []
    for _ in range(7):
        sessions.append(record())
        await store.create(sessions[-1], 100)
        await asyncio.sleep(0.002)  # distinct millisecond prefixes
    await store.create(record(tenant="globex"), 100)

    pages, after = [], ""
    while page := await store.list("acme", after, 3):
        pages.append([s.session_id for s in page])
        after = page[-1].session_id
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [session_id for page in pages for session_id in page] == [s.session_id for s in sessions]


async def test_a_tenant_holds_at_most_its_limit(store: SessionStore) -> None:
    for _ in range(3):
        await store.create(record(), 3)
    with pytest.raises(ResourceExhausted, match="holds 3 sessions"):
        await store.create(record(), 3)
    await store.create(record(tenant="globex"), 3)  # another tenant is not affected


async def test_stored_tokens_follow_saves_deletions_and_expiry(store: SessionStore) -> None:
    short, long = record(ttl_seconds=1), record()
    for session in (short, long):
        await store.create(session, 10)
    assert await store.save(replace(short, token_ids=tuple(range(30))))
    assert await store.save(replace(long, token_ids=tuple(range(100))))
    assert await store.save(replace(long, token_ids=tuple(range(120))))  # a turn grows it
    await store.create(record(tenant="globex"), 10)
    assert await store.stored_tokens("acme") == 150
    assert await store.stored_tokens("globex") == 0

    await asyncio.sleep(1.1)
    assert [s.session_id for s in await store.claim_expired(time.time(), 10)] == [short.session_id]
    assert await store.stored_tokens("acme") == 120
    await store.delete("acme", long.session_id)
    assert await store.stored_tokens("acme") == 0


async def test_turns_of_one_session_run_one_at_a_time(store: SessionStore) -> None:
    session = record()
    inside, overlaps = 0, 0

    async def turn() -> None:
        nonlocal inside, overlaps
        async with store.turn_lock("acme", session.session_id):
            inside += 1
            overlaps += inside > 1
            await asyncio.sleep(0.05)
            inside -= 1

    await asyncio.gather(*(turn() for _ in range(4)))
    assert overlaps == 0


async def test_waiting_for_a_busy_session_times_out_with_unavailable(store: SessionStore) -> None:
    session = record()
    async with store.turn_lock("acme", session.session_id):
        with pytest.raises(Unavailable, match="busy with another turn"):
            async with store.turn_lock("acme", session.session_id):
                pass
    async with store.turn_lock("acme", session.session_id):  # free again
        pass


async def test_the_redis_lock_outlives_its_ttl_while_held(redis_factory: RedisFactory) -> None:
    store = redis_store(redis_factory().url, lock_ttl_seconds=0.3, lock_wait_seconds=0.2)
    try:
        async with store.turn_lock("acme", "a" * 32):
            await asyncio.sleep(1.0)  # three TTLs: renewed in the background
            with pytest.raises(Unavailable):
                async with store.turn_lock("acme", "a" * 32):
                    pass
    finally:
        await store.close()


async def test_a_redis_store_answers_unavailable_while_redis_is_down(redis_factory: RedisFactory) -> None:
    """Both stores on the one client: each names itself."""
    redis = redis_factory()
    store = redis_store(redis.url, lock_ttl_seconds=1, lock_wait_seconds=1)
    try:
        await store.ping()
        redis.stop()
        with pytest.raises(Unavailable, match=r"the session store \(Redis\) is unavailable"):
            await store.get("acme", "a" * 32)
        with pytest.raises(Unavailable, match=r"the schema store \(Redis\) is unavailable"):
            await RedisSchemaStore(store.redis).get("acme", "desk")
    finally:
        await store.close()


async def test_a_turn_ends_even_when_redis_swallows_the_lock_renewals_cancel(
    redis_factory: RedisFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py (8.x asyncio) can swallow a Task.cancel() that lands inside a command: the
    call returns and the task goes on. The turn must still end and free its session."""
    evalsha = aioredis.Redis.evalsha

    async def swallowing_evalsha(self: aioredis.Redis, *args: object) -> object:
        try:
            await asyncio.sleep(0.05)  # the command in flight
        except asyncio.CancelledError:
            pass  # swallowed, as redis-py does
        return await evalsha(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(aioredis.Redis, "evalsha", swallowing_evalsha)
    store = redis_store(redis_factory().url, lock_ttl_seconds=0.3, lock_wait_seconds=LOCK_WAIT_SECONDS)
    started = time.monotonic()
    try:
        async with asyncio.timeout(5):  # a turn stuck on its renewer would wait forever
            async with store.turn_lock("acme", "s"):
                await asyncio.sleep(0.12)  # ends while the first renewal (0.1 to 0.15 s) is in flight
            async with store.turn_lock("acme", "s"):  # and the session is free again
                pass
    finally:
        await store.close()
    assert time.monotonic() - started < 2, "the turn waited for a renewer that ignored its cancel"


async def _tickets(url: str, session_id: str) -> set[bytes]:
    async with aioredis.from_url(url) as redis:
        return set(await redis.zrange(queue_key("acme", session_id), 0, -1))


async def _wait_queued(
    url: str | None, session_id: str, length: int, besides: frozenset[bytes] = frozenset()
) -> None:
    """Until `length` turns (tickets not in `besides`) hold or wait for the session (Redis),
    or one loop pass (embedded: a task reaches the asyncio lock's queue without I/O)."""
    async with asyncio.timeout(10):
        while url is not None and len(await _tickets(url, session_id) - besides) < length:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", ["embedded", "redis"])
async def test_turns_of_one_session_run_in_arrival_order(redis_factory: RedisFactory, kind: str) -> None:
    """16 turns wait behind a running one; they run in the order they arrived (the Redis
    lock used to be polled by every waiter, and the fastest poller won)."""
    url = redis_factory().url if kind == "redis" else None
    store: SessionStore = (
        redis_store(url, lock_ttl_seconds=5, lock_wait_seconds=30)
        if url is not None
        else EmbeddedSessionStore(30)
    )
    session_id, ran = "b" * 32, []

    async def turn(number: int) -> None:
        async with store.turn_lock("acme", session_id):
            ran.append(number)
            await asyncio.sleep(0.01)

    try:
        async with store.turn_lock("acme", session_id):
            tasks = []
            for number in range(16):
                tasks.append(asyncio.create_task(turn(number)))
                await _wait_queued(url, session_id, number + 2)
        await asyncio.gather(*tasks)
    finally:
        await store.close()
    assert ran == list(range(16))


# A scheduler that holds a session's turn and has another one waiting, then is killed.
_DYING_SCHEDULER = """
import asyncio, sys
from attnstore_scheduler.redis_session_store import RedisSessionStore

async def main():
    store = RedisSessionStore(
        sys.argv[1], expiry_grace_seconds=60, lock_ttl_seconds=0.5, lock_wait_seconds=60, max_connections=4,
        pool_timeout_seconds=5,
    )
    holding, waiting = store.turn_lock("acme", sys.argv[2]), store.turn_lock("acme", sys.argv[2])
    await holding.__aenter__()
    asyncio.create_task(waiting.__aenter__())
    await asyncio.sleep(0.2)
    print("holding", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_killed_schedulers_tickets_lapse_and_the_queue_goes_on_in_order(
    redis_factory: RedisFactory,
) -> None:
    """Its two tickets stay in Redis unrenewed: a new scheduler's turns wait one lock TTL for
    them to lapse, then run in their own arrival order."""
    url = redis_factory().url
    session_id = "c" * 32
    dying = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _DYING_SCHEDULER, url, session_id, stdout=asyncio.subprocess.PIPE
    )
    assert dying.stdout is not None
    try:
        async with asyncio.timeout(20):
            assert await dying.stdout.readline() == b"holding\n"
    finally:
        dying.kill()
        await dying.wait()
    dead = frozenset(await _tickets(url, session_id))
    assert len(dead) == 2

    store = redis_store(url, lock_ttl_seconds=0.5, lock_wait_seconds=30)
    ran: list[int] = []
    started = time.monotonic()

    async def turn(number: int) -> None:
        async with store.turn_lock("acme", session_id):
            ran.append(number)

    try:
        tasks = []
        for number in range(4):
            tasks.append(asyncio.create_task(turn(number)))
            await _wait_queued(url, session_id, number + 1, besides=dead)
        await asyncio.gather(*tasks)
    finally:
        await store.close()
    assert ran == [0, 1, 2, 3]
    assert time.monotonic() - started < 5  # waited for the dead tickets' leases, not for ever
