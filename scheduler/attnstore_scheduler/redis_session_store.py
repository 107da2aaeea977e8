"""Sessions in Redis (redis-py asyncio, hiredis parser). See session_store.py for the
behaviour both stores share. Keys (one Redis, not Redis Cluster):

    attnstore:session:<tenant>:<id>   msgpack SessionRecord; PEXPIRE = TTL + expiry grace
    attnstore:sessions:<tenant>       sorted set of the tenant's ids (score 0: ordered by id)
    attnstore:expiries                sorted set "<tenant>/<id>" scored by expiry (Unix seconds)
    attnstore:turns:<tenant>:<id>     the turn queue (redis_turn_queue.py: FIFO tickets with leases)
    attnstore:turn-leases:<tenant>:<id>
    attnstore:tokens:<tenant>         hash: <id> -> history tokens, "total" -> their sum

Expiry is a sweep over `attnstore:expiries` rather than keyspace notifications: those are
fire-and-forget (lost while no scheduler listens, e.g. across a Redis restart) and come
after the record is gone, whereas releasing a session's KV needs its chunk keys. The
record's own PEXPIRE outlives the logical expiry by the grace and only cleans up after a
sweeper that never ran. Every multi-key change is one Lua script, so replicas never see a
half-made change and each expired session is claimed by exactly one of them.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from attnstore_scheduler.redis_calls import RedisCalls
from attnstore_scheduler.redis_turn_queue import IN_TURN_LUA, RedisTurnQueue, leases_key
from attnstore_scheduler.session_record import SessionRecord
from attnstore_scheduler.session_store import too_many_sessions

_PREFIX = "attnstore"
_EXPIRIES = f"{_PREFIX}:expiries"
_LIST_BATCH = 200

# KEYS: record, tenant index, expiries. ARGV: record bytes, id, expiry member, expires_at,
# record TTL ms, max sessions per tenant. Returns 0 when the tenant is full.
_CREATE = """
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[6]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[5])
redis.call('ZADD', KEYS[2], 0, ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
return 1
"""
# KEYS: record, expiries, tokens. ARGV: record bytes, record TTL ms, expiry member,
# expires_at, id, history tokens.
_SAVE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
local held = tonumber(redis.call('HGET', KEYS[3], ARGV[5]) or '0')
redis.call('HSET', KEYS[3], ARGV[5], ARGV[6])
redis.call('HINCRBY', KEYS[3], 'total', tonumber(ARGV[6]) - held)
return 1
"""
# Takes a session's tokens out of its tenant's total (deletion, expiry).
_FORGET_TOKENS = """
local function forget_tokens(tokens_key, id)
  local held = redis.call('HGET', tokens_key, id)
  if held then
    redis.call('HDEL', tokens_key, id)
    redis.call('HINCRBY', tokens_key, 'total', 0 - tonumber(held))  -- not -held: Lua's -0 is no integer
  end
end
"""
# KEYS: record, tenant index, expiries, tokens. ARGV: id, expiry member. Returns the
# record or false.
_DELETE = (
    _FORGET_TOKENS
    + """
forget_tokens(KEYS[4], ARGV[1])
local record = redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[2])
return record
"""
)
# KEYS: record, tenant index, expiries, turn leases, tokens. ARGV: id, expiry member, now.
# Returns {0} when not claimable (refreshed, claimed by another, or in a turn), else
# {1, record} (record "" when its key already expired on its own).
_CLAIM = (
    _FORGET_TOKENS
    + IN_TURN_LUA
    + """
local score = redis.call('ZSCORE', KEYS[3], ARGV[2])
if not score or tonumber(score) > tonumber(ARGV[3]) then return {0} end
if in_turn(KEYS[4]) then return {0} end
forget_tokens(KEYS[5], ARGV[1])
local record = redis.call('GET', KEYS[1]) or ''
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[2])
return {1, record}
"""
)


def _record_key(tenant: str, session_id: str) -> str:
    return f"{_PREFIX}:session:{tenant}:{session_id}"


def _index_key(tenant: str) -> str:
    return f"{_PREFIX}:sessions:{tenant}"


def _tokens_key(tenant: str) -> str:
    return f"{_PREFIX}:tokens:{tenant}"


def _member(tenant: str, session_id: str) -> str:
    return f"{tenant}/{session_id}"  # tenant names have no "/"


class RedisSessionStore:
    def __init__(
        self,
        url: str,
        *,
        expiry_grace_seconds: int,
        lock_ttl_seconds: float,
        lock_wait_seconds: float,
        max_connections: int,
        pool_timeout_seconds: float,
    ) -> None:
        """At most `max_connections` to Redis; a call finding them all busy waits up to
        `pool_timeout_seconds` for one (redis-py's default pool fails at once: a flood of
        calls answered UNAVAILABLE "Too many connections" and the expiry sweep failed)."""
        # Reconnects by itself: a call during a Redis restart retries with backoff, and
        # the ones that still fail answer UNAVAILABLE.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=pool_timeout_seconds,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            socket_connect_timeout=2.0,
            socket_timeout=5.0,
            health_check_interval=10,
        )
        self._redis = aioredis.Redis(connection_pool=pool)
        self._grace_ms = expiry_grace_seconds * 1000
        self._call = RedisCalls("session store")
        self._turns = RedisTurnQueue(
            self._redis, self._call, lease_ttl_seconds=lock_ttl_seconds, wait_seconds=lock_wait_seconds
        )
        self._create = self._redis.register_script(_CREATE)
        self._save = self._redis.register_script(_SAVE)
        self._delete = self._redis.register_script(_DELETE)
        self._claim = self._redis.register_script(_CLAIM)

    @property
    def redis(self) -> aioredis.Redis:
        """The client, shared with the schema store (redis_schema_store.py)."""
        return self._redis

    def _ttl_ms(self, record: SessionRecord) -> int:
        return record.ttl_seconds * 1000 + self._grace_ms

    async def create(self, record: SessionRecord, max_sessions_per_tenant: int) -> None:
        keys = [_record_key(record.tenant, record.session_id), _index_key(record.tenant), _EXPIRIES]
        args = [
            record.encode(),
            record.session_id,
            _member(record.tenant, record.session_id),
            record.expires_at,
            self._ttl_ms(record),
            max_sessions_per_tenant,
        ]
        if not await self._call(self._create(keys=keys, args=args)):
            raise too_many_sessions(record.tenant, max_sessions_per_tenant)

    async def get(self, tenant: str, session_id: str) -> SessionRecord | None:
        data = await self._call(self._redis.get(_record_key(tenant, session_id)))
        return _live(data, time.time())

    async def save(self, record: SessionRecord) -> bool:
        keys = [_record_key(record.tenant, record.session_id), _EXPIRIES, _tokens_key(record.tenant)]
        args = [
            record.encode(),
            self._ttl_ms(record),
            _member(record.tenant, record.session_id),
            record.expires_at,
            record.session_id,
            len(record.token_ids),
        ]
        return bool(await self._call(self._save(keys=keys, args=args)))

    async def delete(self, tenant: str, session_id: str) -> SessionRecord | None:
        keys = [_record_key(tenant, session_id), _index_key(tenant), _EXPIRIES, _tokens_key(tenant)]
        data = await self._call(self._delete(keys=keys, args=[session_id, _member(tenant, session_id)]))
        return SessionRecord.decode(data) if data else None

    async def list(self, tenant: str, after_id: str, limit: int) -> list[SessionRecord]:
        page: list[SessionRecord] = []
        now = time.time()
        while len(page) < limit:
            ids: list[bytes] = await self._call(
                self._redis.zrangebylex(
                    _index_key(tenant), f"({after_id}" if after_id else "-", "+", start=0, num=_LIST_BATCH
                )
            )
            if not ids:
                break
            names = [_record_key(tenant, session_id.decode()) for session_id in ids]
            values: list[Any] = await self._call(self._redis.mget(names))
            page.extend(record for data in values if (record := _live(data, now)) is not None)
            after_id = ids[-1].decode()
        return page[:limit]

    async def claim_expired(self, now: float, limit: int) -> list[SessionRecord]:
        members: list[bytes] = await self._call(
            self._redis.zrangebyscore(_EXPIRIES, "-inf", now, start=0, num=limit)
        )
        claimed: list[SessionRecord] = []
        for member in members:
            tenant, _, session_id = member.decode().partition("/")
            keys = [
                _record_key(tenant, session_id),
                _index_key(tenant),
                _EXPIRIES,
                leases_key(tenant, session_id),
                _tokens_key(tenant),
            ]
            reply = await self._call(self._claim(keys=keys, args=[session_id, member, now]))
            if reply[0] == 1 and reply[1]:
                claimed.append(SessionRecord.decode(reply[1]))
        return claimed

    async def stored_tokens(self, tenant: str) -> int:
        return int(await self._call(self._redis.hget(_tokens_key(tenant), "total")) or 0)

    def turn_lock(self, tenant: str, session_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self._turns.turn(tenant, session_id)

    async def ping(self) -> None:
        await self._call(self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()


def _live(data: bytes | None, now: float) -> SessionRecord | None:
    if not data:
        return None
    record = SessionRecord.decode(data)
    return record if record.expires_at > now else None
