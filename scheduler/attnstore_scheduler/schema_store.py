"""Where a tenant's PML schemas are kept: in Redis beside the sessions
(redis_schema_store.py), or in process memory without Redis. A schema has no TTL: it lives
until deleted. Both stores refuse a new schema past the tenant's limit in the same step
that adds it, so concurrent registrations cannot overshoot."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

import msgpack

from attnstore.errors import ResourceExhausted


@dataclass(frozen=True)
class SchemaRecord:
    tenant: str
    name: str
    document: str
    digest: str  # hex schema digest (attnstore.prompt_modules.schema_digest)
    modules: int
    registered_at: float  # Unix seconds

    def encode(self) -> bytes:
        return msgpack.packb(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> SchemaRecord:
        return cls(**msgpack.unpackb(data))


class SchemaStore(Protocol):
    async def put(self, record: SchemaRecord, max_schemas_per_tenant: int) -> None:
        """Adds or replaces the tenant's schema of that name; ResourceExhausted when a new
        one would pass the limit."""

    async def get(self, tenant: str, name: str) -> SchemaRecord | None: ...

    async def list(self, tenant: str) -> list[SchemaRecord]:
        """By name."""

    async def delete(self, tenant: str, name: str) -> bool: ...


def too_many_schemas(tenant: str, limit: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"tenant {tenant!r} already has {limit} schemas (max_schemas_per_tenant); delete one first"
    )


class EmbeddedSchemaStore:
    """Schemas in this process (no Redis): lost on restart, not shared between replicas."""

    def __init__(self) -> None:
        self._schemas: dict[str, dict[str, SchemaRecord]] = {}

    async def put(self, record: SchemaRecord, max_schemas_per_tenant: int) -> None:
        tenant = self._schemas.setdefault(record.tenant, {})
        if record.name not in tenant and len(tenant) >= max_schemas_per_tenant:
            raise too_many_schemas(record.tenant, max_schemas_per_tenant)
        tenant[record.name] = record

    async def get(self, tenant: str, name: str) -> SchemaRecord | None:
        return self._schemas.get(tenant, {}).get(name)

    async def list(self, tenant: str) -> list[SchemaRecord]:
        return sorted(self._schemas.get(tenant, {}).values(), key=lambda record: record.name)

    async def delete(self, tenant: str, name: str) -> bool:
        return self._schemas.get(tenant, {}).pop(name, None) is not None
