"""Asynchronous saving: a turn's new chunks go to the daemon off the critical path.

Each save is a task the saver keeps until it ends (the event loop holds tasks only
weakly); encoding (a device-to-host copy, serialization, checksums) runs in a thread so
the event loop keeps serving other turns. A failed save is logged and forgotten: the
next turn recomputes what is missing.

A turn that follows right after the one that computed its history (a client that answers
at once, a load test) would look its chunks up before their save lands and recompute
them; `settle` lets it wait, boundedly, for the saves in flight of the keys it wants
(read-your-writes on this worker), which costs far less than recomputing them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
import torch

from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.kv_codec import encode_chunks
from inference_worker.restore.codec import encode_restore_chunks
from inference_worker.restore.turns import RestoreForm
from inference_worker.turn_types import KVSource

log = structlog.get_logger("inference_worker.kv_saver")

KV = Sequence[tuple[torch.Tensor, torch.Tensor]]  # per layer K, V [kv_heads, tokens, head_dim]


@dataclass(frozen=True)
class ChunkRun:
    """Consecutive chunks to save: full ones, the last possibly partial."""

    keys: Sequence[bytes]  # their chain keys, in order
    kv: KV  # per layer K, V [kv_heads, tokens, head_dim]; tokens > (len(keys) - 1) * chunk_tokens
    base_position: int  # the position the first token's key was rotated for
    restore: RestoreForm | None = None  # a namespace of restore chunks: its plan and hidden states


class ChunkSaver:
    def __init__(self, client: AsyncKVStoreClient) -> None:
        self.client = client
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: dict[tuple[bytes, bytes], asyncio.Task[None]] = {}  # (namespace, key)

    def save(
        self,
        source: KVSource,
        runs: Sequence[ChunkRun],
        *,
        replace_keys: Sequence[bytes] = (),
        before_put: Callable[[], Awaitable[object]] | None = None,
    ) -> int:
        """Starts saving the chunks of `runs` in one put; returns how many. `replace_keys`
        (chunks that failed to load) are deleted first: a put would keep them as "already
        stored". `before_put` runs before the put (registering the namespace). The KV
        tensors must not change afterwards."""
        runs = [run for run in runs if run.keys]
        count = sum(len(run.keys) for run in runs)
        if not count:
            return 0
        save = self._save(source, runs, tuple(replace_keys), before_put)
        task = asyncio.get_running_loop().create_task(save, name=f"save-{count}-chunks")
        self._tasks.add(task)
        slots = [(source.namespace, key) for run in runs for key in run.keys]
        self._in_flight.update(dict.fromkeys(slots, task))
        task.add_done_callback(lambda done: self._forget(done, slots))
        return count

    def _forget(self, task: asyncio.Task[None], slots: list[tuple[bytes, bytes]]) -> None:
        self._tasks.discard(task)
        for slot in slots:
            if self._in_flight.get(slot) is task:  # a later save of the same key keeps its entry
                del self._in_flight[slot]

    async def settle(self, namespace: bytes, keys: Sequence[bytes], timeout_seconds: float) -> None:
        """Waits, at most `timeout_seconds`, for the saves in flight of any of `keys`."""
        tasks = {task for key in keys if (task := self._in_flight.get((namespace, key))) is not None}
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_seconds)

    async def _save(
        self,
        source: KVSource,
        runs: list[ChunkRun],
        replace_keys: tuple[bytes, ...],
        before_put: Callable[[], Awaitable[object]] | None,
    ) -> None:
        started = time.perf_counter()
        namespace = source.namespace
        keys = [key for run in runs for key in run.keys]
        try:
            chunks = await asyncio.to_thread(_encode, namespace, runs, source.chunk_tokens)
            if replace_keys:
                await self.client.delete(namespace, replace_keys)
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
            in_progress=len(result.in_progress),  # another writer's reservation: it stores them
            seconds=round(time.perf_counter() - started, 4),
        )

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        """Waits until every save submitted so far (and any submitted meanwhile) has ended."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _encode(namespace: bytes, runs: Sequence[ChunkRun], chunk_tokens: int) -> list[bytes]:
    return [chunk for run in runs for chunk in _encode_run(namespace, run, chunk_tokens)]


def _encode_run(namespace: bytes, run: ChunkRun, chunk_tokens: int) -> list[bytes]:
    if run.restore is None:
        return encode_chunks(
            namespace, run.keys, run.kv, chunk_tokens, run.base_position, include_partial=True
        )
    form = run.restore
    chunks = encode_restore_chunks(
        namespace, run.keys, form.storage, form.geometry, run.kv, form.hidden, chunk_tokens,
        run.base_position, include_partial=True,
    )  # fmt: skip
    k = run.kv[0][0]  # [kv_heads, tokens, D]
    form.observe_saved(k.shape[1], k.element_size())
    return chunks
