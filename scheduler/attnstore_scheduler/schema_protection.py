"""Registered schemas' module KV stays protected on the daemon while the schema is
registered: the chunk keys a worker reports when it encodes a schema (EncodeSchema) are
kept here per node and namespace, and the hint pusher sends them PROTECT under their own
source (`<source>/schemas`, replaced whole, at least every refresh) until DeleteSchema
drops them; the next push then replaces that namespace's hints with none, and the chunks
are evicted like any other.

Decisions: kept in the scheduler's memory (not in the schema's Redis record): a restarted
scheduler, or another replica, protects a schema again when it is registered again (each
use still hints its modules PROTECT for the daemon's hint TTL, as before). One node per
schema: the node that encoded it at registration; another node that encodes it lazily
relies on the per-use hints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from attnstore.kvstore_client import HintAction
from attnstore_scheduler.lookahead import HintEntry

SCHEMAS_SOURCE_SUFFIX = "/schemas"
# After every queued job's chunks (the lookahead policy evicts the furthest position first),
# before any unhinted chunk.
SCHEMA_QUEUE_POSITION = 2**32 - 1


@dataclass(frozen=True)
class ProtectedSchema:
    node: str
    namespace: bytes
    chunk_keys: tuple[bytes, ...]


class SchemaProtection:
    def __init__(self) -> None:
        self._schemas: dict[tuple[str, str], ProtectedSchema] = {}  # (tenant, name) ->
        self._listeners: list[Callable[[], None]] = []
        self.changed = False  # since the pusher last read hints()

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def protect(
        self, tenant: str, name: str, node: str, namespace: bytes, chunk_keys: Iterable[bytes]
    ) -> None:
        """The schema's module chunks on `node` (replacing what it had: a schema registered
        again may have other modules)."""
        self._schemas[tenant, name] = ProtectedSchema(node, namespace, tuple(dict.fromkeys(chunk_keys)))
        self._changed()

    def drop(self, tenant: str, name: str) -> None:
        if self._schemas.pop((tenant, name), None) is not None:
            self._changed()

    def hints(self, node: str) -> dict[bytes, list[HintEntry]]:
        """PROTECT entries for `node`'s daemon, by namespace."""
        hints: dict[bytes, list[HintEntry]] = {}
        for schema in self._schemas.values():
            if schema.node == node:
                hints.setdefault(schema.namespace, []).append(
                    HintEntry(schema.chunk_keys, HintAction.PROTECT, SCHEMA_QUEUE_POSITION)
                )
        return hints

    def _changed(self) -> None:
        self.changed = True
        for listener in self._listeners:
            listener()
