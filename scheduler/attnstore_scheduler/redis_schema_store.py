"""PML schemas in Redis, beside the sessions (redis_session_store.py):

attnstore:schemas:<tenant>   hash: schema name -> msgpack SchemaRecord (no TTL)
"""

from __future__ import annotations

import redis.asyncio as aioredis

from attnstore_scheduler.redis_calls import RedisCalls
from attnstore_scheduler.schema_store import SchemaRecord, too_many_schemas

# KEYS: the tenant's hash. ARGV: name, record, limit. Returns 0 when a new one is over the limit.
_PUT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


def _key(tenant: str) -> str:
    return f"attnstore:schemas:{tenant}"


class RedisSchemaStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        """Shares the session store's client (its pool, retries and timeouts)."""
        self._redis = redis
        self._put = redis.register_script(_PUT)
        self._call = RedisCalls("schema store")

    async def put(self, record: SchemaRecord, max_schemas_per_tenant: int) -> None:
        args = [record.name, record.encode(), max_schemas_per_tenant]
        if not await self._call(self._put(keys=[_key(record.tenant)], args=args)):
            raise too_many_schemas(record.tenant, max_schemas_per_tenant)

    async def get(self, tenant: str, name: str) -> SchemaRecord | None:
        data = await self._call(self._redis.hget(_key(tenant), name))
        return SchemaRecord.decode(data) if data else None

    async def list(self, tenant: str) -> list[SchemaRecord]:
        entries = await self._call(self._redis.hgetall(_key(tenant)))
        return sorted((SchemaRecord.decode(data) for data in entries.values()), key=lambda r: r.name)

    async def delete(self, tenant: str, name: str) -> bool:
        return bool(await self._call(self._redis.hdel(_key(tenant), name)))
