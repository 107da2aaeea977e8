"""The turns of one session in arrival order, across scheduler replicas (Redis).

A turn takes a ticket: it joins the session's queue, a sorted set scored by arrival
(one more than the last ticket's score), and runs once its ticket is first. Every ticket
carries a lease (a deadline in a hash beside the queue, on Redis' clock) that its turn
renews while it waits and while it runs; a ticket whose lease lapsed (its scheduler died,
or stopped answering) is dropped by the next turn that looks at the queue, so a dead
holder or waiter delays the session by one lease TTL at most, and the queue outlives a
scheduler restart. Waiters poll: who polls first does not matter, only the ticket order,
and a poll costs one short script (no connection held per waiter, as BLPOP would). A
waiter with n tickets ahead polls every n x 20 ms (the turns ahead take longer than
that), so a session with a thousand waiters costs Redis tens of polls per turn, not a
thousand every 20 ms (which exhausted the connection pool in a 10,000-call flood).

    attnstore:turns:<tenant>:<id>        sorted set: ticket -> arrival number
    attnstore:turn-leases:<tenant>:<id>  hash: ticket -> lease deadline (ms, Redis' clock)

Both keys expire one lease TTL after the last renewal, so an abandoned queue goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from attnstore.errors import Unavailable
from attnstore_scheduler.session_store import lock_timeout

log = structlog.get_logger("attnstore_scheduler.redis_turn_queue")

# The next waiter asks again this often: the delay a finished turn adds before the next
# one starts. Waiters further back ask proportionally less often.
_POLL_SECONDS = 0.02

_NOW_MS = """
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""
# Sets the ticket's lease to ARGV[2] ms from now and keeps both keys that long.
_LEASE = """
redis.call('HSET', KEYS[2], ARGV[1], now_ms + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
"""
# KEYS: queue, leases. ARGV: ticket, lease ms. Joins at the back.
_JOIN = (
    _NOW_MS
    + """
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local arrival = 0
if last[2] then arrival = tonumber(last[2]) + 1 end
redis.call('ZADD', KEYS[1], arrival, ARGV[1])
"""
    + _LEASE
    + "return 1"
)
# KEYS: queue, leases. ARGV: ticket, lease ms. Renews the ticket's lease and drops lapsed
# tickets at the head. 0: the ticket is first (its turn runs); n > 0: n tickets are ahead
# of it; -1: it is gone (its own lease lapsed and another turn dropped it).
_RENEW = (
    _NOW_MS
    + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return -1 end
"""
    + _LEASE
    + """
while true do
  local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if head == ARGV[1] then return 0 end
  if tonumber(redis.call('HGET', KEYS[2], head) or '0') > now_ms then
    return redis.call('ZRANK', KEYS[1], ARGV[1])
  end
  redis.call('ZREM', KEYS[1], head)
  redis.call('HDEL', KEYS[2], head)
end
"""
)
# KEYS: queue, leases. ARGV: ticket.
_LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""
# Lua for other scripts: `in_turn(leases_key)` is true while a ticket's lease runs (a turn
# runs or waits), e.g. to keep the session from expiring under it.
IN_TURN_LUA = (
    _NOW_MS
    + """
local function in_turn(leases_key)
  local leases = redis.call('HVALS', leases_key)
  for _, deadline in ipairs(leases) do
    if tonumber(deadline) > now_ms then return true end
  end
  return false
end
"""
)


def queue_key(tenant: str, session_id: str) -> str:
    return f"attnstore:turns:{tenant}:{session_id}"


def leases_key(tenant: str, session_id: str) -> str:
    return f"attnstore:turn-leases:{tenant}:{session_id}"


class RedisTurnQueue:
    def __init__(
        self,
        redis: aioredis.Redis,
        call: Callable[[Awaitable[int]], Awaitable[int]],
        *,
        lease_ttl_seconds: float,
        wait_seconds: float,
    ) -> None:
        """`call` runs a Redis command, turning RedisError into Unavailable."""
        self._call = call
        self._lease_ms = max(1, int(lease_ttl_seconds * 1000))
        self._lease_ttl_seconds = lease_ttl_seconds
        self._wait_seconds = wait_seconds
        self._join = redis.register_script(_JOIN)
        self._renew = redis.register_script(_RENEW)
        self._leave = redis.register_script(_LEAVE)

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str, session_id: str) -> AsyncIterator[None]:
        """Held for a whole turn, granted in arrival order; Unavailable when the turns ahead
        take longer than the wait."""
        keys = [queue_key(tenant, session_id), leases_key(tenant, session_id)]
        ticket = secrets.token_hex(16)
        await self._call(self._join(keys=keys, args=[ticket, self._lease_ms]))
        try:
            await self._wait_first(keys, ticket, session_id)
            renewer = asyncio.get_running_loop().create_task(self._keep(keys, ticket, session_id))
            try:
                yield
            finally:
                renewer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewer
        finally:
            try:
                await self._leave(keys=keys, args=[ticket])
            except RedisError as exc:  # Redis gone: the lease ends the ticket
                log.warning("session_lock_release_failed", session_id=session_id, error=repr(exc))

    async def _wait_first(self, keys: list[str], ticket: str, session_id: str) -> None:
        task = asyncio.current_task()
        deadline = asyncio.get_running_loop().time() + self._wait_seconds
        while True:
            ahead = await self._call(self._renew(keys=keys, args=[ticket, self._lease_ms]))
            if ahead == 0:
                return
            if ahead == -1:
                raise Unavailable(
                    f"session {session_id}: this turn lost its place in the session's queue (the session "
                    "store did not answer within the lock TTL); retry"
                )
            if task is not None and task.cancelling():  # redis-py may swallow a cancel mid-command
                raise asyncio.CancelledError
            if asyncio.get_running_loop().time() > deadline:
                raise lock_timeout(session_id, self._wait_seconds)
            await asyncio.sleep(min(_POLL_SECONDS * ahead, self._lease_ttl_seconds / 3))  # renews in time

    async def _keep(self, keys: list[str], ticket: str, session_id: str) -> None:
        """Renews the running turn's lease (a turn may outlast it). Ends when cancelled, also
        when the cancel landed inside a Redis call and redis-py swallowed it (the call
        returns, the task goes on): cancelling() still counts the request."""
        task = asyncio.current_task()
        while task is not None and not task.cancelling():
            await asyncio.sleep(self._lease_ttl_seconds / 3)
            try:
                ahead = await self._renew(keys=keys, args=[ticket, self._lease_ms])
            except RedisError as exc:
                log.warning("session_lock_renewal_failed", session_id=session_id, error=repr(exc))
                continue
            if ahead != 0:
                log.warning("session_lock_lost", session_id=session_id, ahead=ahead)
