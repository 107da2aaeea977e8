"""The model's chunk namespaces (one per tenant salt) and their registration with the
daemon, done once per namespace and retried after a failure by whoever needs it next
(at most once per RETRY_SECONDS: a daemon that does not answer must not cost every turn
a registration timeout).

The daemon may forget a namespace unused for its `namespace_idle_seconds` (15 min by
default) that holds no chunk, so one this worker has not used for REREGISTER_IDLE_SECONDS
is registered again before its next use (one cheap, idempotent call)."""

from __future__ import annotations

import asyncio
import time

import grpc
import structlog

from attnstore.chunks.keys import NamespaceSpec
from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.model_runner import ModelRunner
from inference_worker.model_store import model_digest
from inference_worker.turn_types import KVSource

log = structlog.get_logger("inference_worker.namespaces")

RETRY_SECONDS = 5.0
REREGISTER_IDLE_SECONDS = 60.0  # well under the daemon's namespace_idle_seconds


class Namespaces:
    def __init__(
        self,
        runner: ModelRunner,
        client: AsyncKVStoreClient | None,
        *,
        chunk_tokens: int,
        timeout_seconds: float,
        storage_plan: str = "",
    ) -> None:
        """`storage_plan`: StoragePlan.namespace_tag of the chunks saved ("" = KV chunks)."""
        self.runner = runner
        self.storage_plan = storage_plan
        self.client = client
        self.chunk_tokens = chunk_tokens
        self.timeout_seconds = timeout_seconds
        self.retry_seconds = RETRY_SECONDS
        self.reregister_idle_seconds = REREGISTER_IDLE_SECONDS
        self._digest: str | None = None
        self._last_used: dict[bytes, float] = {}  # registered namespaces: monotonic time of last use
        self._retry_at: dict[bytes, float] = {}  # monotonic time of the next attempt after a failure
        self._refusals: dict[bytes, str] = {}  # the daemon's RESOURCE_EXHAUSTED message, per namespace

    async def source_for(self, tenant_salt: bytes) -> KVSource:
        """The namespace of this model, dtype and chunk size for a tenant; registered now if
        the daemon answers, else later."""
        if self._digest is None:  # hashes the weights once (then cached beside them)
            self._digest = await asyncio.to_thread(model_digest, self.runner.loaded.model_dir)
        spec = NamespaceSpec(
            self._digest,
            self.runner.dtype_name,
            self.chunk_tokens,
            tenant_salt,
            storage_plan=self.storage_plan,
        )
        source = KVSource(namespace=spec.namespace_id(), chunk_tokens=self.chunk_tokens)
        await self.ensure_registered(source)
        return source

    async def ensure_registered(self, source: KVSource) -> bool:
        """Whether the daemon knows the namespace (registering it now if needed); never raises."""
        now, last_used = time.monotonic(), self._last_used.get(source.namespace)
        if last_used is not None and now - last_used < self.reregister_idle_seconds:
            self._last_used[source.namespace] = now
            return True
        if self.client is None or now < self._retry_at.get(source.namespace, 0.0):
            return False
        runner, geometry = self.runner, self.runner.geometry
        try:
            await asyncio.wait_for(
                self.client.register_namespace(
                    source.namespace,
                    num_layers=geometry.num_layers,
                    kv_heads=geometry.kv_heads,
                    head_dim=geometry.head_dim,
                    chunk_tokens=source.chunk_tokens,
                    dtype=source.dtype or runner.dtype_name,
                    model_label=runner.loaded.model_dir.name,
                ),
                self.timeout_seconds,
            )
        except Exception as exc:  # noqa: BLE001 -- registration is retried by the next caller
            log.warning("registering the namespace failed", namespace=source.namespace.hex(), error=repr(exc))
            self._retry_at[source.namespace] = time.monotonic() + self.retry_seconds
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._refusals[source.namespace] = exc.details() or "RESOURCE_EXHAUSTED"
            return False
        self._last_used[source.namespace] = time.monotonic()
        self._refusals.pop(source.namespace, None)
        return True

    def refusal(self, namespace: bytes) -> str:
        """The daemon's reason for refusing the namespace at its last registration ("" if none)."""
        return self._refusals.get(namespace, "")
