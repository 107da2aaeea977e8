"""Asynchronous saving: a turn's new full chunks go to the daemon off the critical path.

Each save is a task the saver keeps until it ends (the event loop holds tasks only
weakly); encoding (a device-to-host copy, serialization, checksums) runs in a thread so
the event loop keeps serving other turns. A failed save is logged and forgotten: the
next turn recomputes what is missing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import structlog
import torch
from transformers import DynamicCache

from attnstore.chunks.keys import chunk_key_chain
from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.kv_codec import encode_chunks
from inference_worker.turn_types import KVSource

log = structlog.get_logger("inference_worker.kv_saver")

KV = Sequence[tuple[torch.Tensor, torch.Tensor]]  # per layer K, V [kv_heads, tokens, head_dim]


class ChunkSaver:
    def __init__(self, client: AsyncKVStoreClient) -> None:
        self.client = client
        self._tasks: set[asyncio.Task[None]] = set()

    def save_new_chunks(
        self,
        source: KVSource,
        tokens: Sequence[int],
        cache: DynamicCache,
        *,
        stored_chunks: int,
        evict_keys: Sequence[bytes] = (),
        before_put: Callable[[], Awaitable[object]] | None = None,
    ) -> int:
        """Starts saving the full chunks of `tokens` (those whose KV `cache` holds, token i
        at position i) from chunk `stored_chunks` on; returns how many. `evict_keys` (chunks
        that failed to load) are deleted first: a put would keep them as "already stored".
        `before_put` runs before the put (registering the namespace). The cache must not
        change afterwards."""
        chunk_tokens = source.chunk_tokens
        end_chunk = len(tokens) // chunk_tokens
        if end_chunk <= stored_chunks:
            return 0
        span = slice(stored_chunks * chunk_tokens, end_chunk * chunk_tokens)
        if any(layer.keys is None or layer.keys.shape[-2] < span.stop for layer in cache.layers):
            log.info("the cache does not hold every token (sliding window): not saving")
            return 0
        keys = chunk_key_chain(source.namespace, tokens[: span.stop], chunk_tokens)[stored_chunks:]
        # each [kv_heads, span tokens, head_dim]: views, encoded later in a thread
        kv = [(layer.keys[0, :, span, :], layer.values[0, :, span, :]) for layer in cache.layers]
        save = self._save(source, keys, kv, span.start, tuple(evict_keys), before_put)
        task = asyncio.get_running_loop().create_task(save, name=f"save-{len(keys)}-chunks")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return len(keys)

    async def _save(
        self,
        source: KVSource,
        keys: list[bytes],
        kv: KV,
        base_position: int,
        evict_keys: tuple[bytes, ...],
        before_put: Callable[[], Awaitable[object]] | None,
    ) -> None:
        started = time.perf_counter()
        namespace = source.namespace
        try:
            chunks = await asyncio.to_thread(
                encode_chunks, namespace, keys, kv, source.chunk_tokens, base_position
            )
            if evict_keys:
                await self.client.delete(namespace, evict_keys)
            if before_put is not None:
                await before_put()
            result = await self.client.put_chunks(namespace, list(zip(keys, chunks, strict=True)))
        except Exception as exc:  # noqa: BLE001 -- a lost save only costs a recompute later
            log.warning("saving chunks failed", chunks=len(keys), error=repr(exc))
            return
        if result.no_space:
            log.warning("the daemon had no space for chunks", chunks=len(result.no_space))
        log.debug(
            "saved chunks",
            stored=len(result.stored),
            already_stored=len(result.already_stored),
            seconds=round(time.perf_counter() - started, 4),
        )

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        """Waits until every save submitted so far (and any submitted meanwhile) has ended."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
