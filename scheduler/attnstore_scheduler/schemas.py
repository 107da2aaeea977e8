"""A tenant's PML schemas: checked with the shared parser (every error names line and
element), stored (schema_store.py), and, with eager encoding, encoded on a worker at
registration so the first prompt finds its modules stored. Module KV lives per node: the
node that encoded a schema becomes the affinity of its prompts (Turns), and another node
encodes it lazily on first use."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
import structlog

from attnstore.errors import InvalidArgument, NotFound
from attnstore.prompt_modules import PmlLimits, module_paths, parse_prompt, parse_schema, schema_digest
from attnstore_scheduler.schema_protection import SchemaProtection
from attnstore_scheduler.schema_store import SchemaRecord, SchemaStore
from attnstore_scheduler.worker_registry import WorkerRegistry

log = structlog.get_logger("attnstore_scheduler.schemas")


@dataclass(frozen=True)
class EncodeStep:
    done: int
    total: int
    module: str
    encoded: bool  # False: the store already held it


class Schemas:
    def __init__(
        self,
        store: SchemaStore,
        registry: WorkerRegistry,
        limits: PmlLimits,
        *,
        max_schemas_per_tenant: int,
        eager_encoding: bool,
        encode_timeout_seconds: float,
        remember_node: Callable[[str, str, str], None],
        protection: SchemaProtection | None = None,
    ) -> None:
        """`remember_node(tenant, schema name, node)`: where the schema's module KV now is;
        `protection`: keeps an eagerly encoded schema's module chunks protected until deleted."""
        self._protection = protection
        self.store = store
        self._registry = registry
        self.limits = limits
        self._max_schemas = max_schemas_per_tenant
        self._eager = eager_encoding
        self._encode_timeout_seconds = encode_timeout_seconds
        self._remember_node = remember_node

    async def register(self, tenant: str, document: str) -> AsyncIterator[EncodeStep | SchemaRecord]:
        """Stores the schema (replacing one of the same name), encodes it when eager (a
        step per module), and ends with its record. Raises PmlError, ResourceExhausted."""
        schema = parse_schema(document, self.limits)
        record = SchemaRecord(
            tenant=tenant,
            name=schema.name,
            document=document,
            digest=schema_digest(schema).hex(),
            modules=len(module_paths(schema)),
            registered_at=time.time(),
        )
        await self.store.put(record, self._max_schemas)
        if self._eager:
            async for step in self._encode(record):
                yield step
        yield record

    async def for_prompt(self, tenant: str, pml: str) -> SchemaRecord:
        """The tenant's schema a PML prompt imports from. Raises PmlError, NotFound."""
        name = parse_prompt(pml, self.limits).schema
        record = await self.store.get(tenant, name)
        if record is None:
            raise NotFound(f"no schema {name!r} is registered (RegisterSchema)")
        return record

    async def list(self, tenant: str) -> list[SchemaRecord]:
        return await self.store.list(tenant)

    async def delete(self, tenant: str, name: str) -> bool:
        if self._protection is not None:
            self._protection.drop(tenant, name)
        return await self.store.delete(tenant, name)

    async def _encode(self, record: SchemaRecord) -> AsyncIterator[EncodeStep]:
        """On one healthy worker; a worker failure leaves the schema to lazy encoding."""
        worker = min(
            (w for w in self._registry.workers() if w.healthy and w.model is not None),
            key=lambda w: w.in_flight,
            default=None,
        )
        if worker is None:
            log.warning("no worker to encode the schema; its modules encode on first use", schema=record.name)
            return
        namespace, keys = b"", []
        steps = worker.client.encode_schema(
            record.tenant, record.document, timeout_seconds=self._encode_timeout_seconds
        )
        try:
            async for step in steps:
                namespace = step.namespace
                keys += step.chunk_keys
                yield EncodeStep(step.done, step.total, step.module, step.encoded)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # the model cannot take it: refuse it
                await self.store.delete(record.tenant, record.name)
                raise InvalidArgument(f"the worker refused the schema: {exc.details()}") from exc
            log.warning("encoding the schema failed; its modules encode on first use", error=exc.details())
            return
        self._remember_node(record.tenant, record.name, worker.node)
        if self._protection is not None:
            self._protection.protect(record.tenant, record.name, worker.node, namespace, keys)
