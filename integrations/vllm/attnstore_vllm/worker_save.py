"""Saving: each attention layer's KV of the chunks a step completes is gathered out of
vLLM's blocks right after the layer ran (`save_kv_layer`); once the step is over, each
whole chunk is encoded in the project's chunk format and put to the daemon by a task on
the store loop. The gather is a copy, so vLLM may free or reuse the blocks at once: no
request's free waits for the daemon (`request_finished` answers False).

Saves of a request whose load failed in the same step are dropped: its later tokens were
computed over KV that vLLM throws away. Beyond `max_pending_save_bytes` of chunks not yet
put, new chunks are dropped (counted): a slow daemon costs future hits, never memory.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import structlog
import torch

from attnstore.chunks.format import encode_chunk
from attnstore.kvstore_client import KVStoreClient
from attnstore_vllm import metrics
from attnstore_vllm.kv_layout import KVViews, gather_blocks
from attnstore_vllm.namespaces import NamespaceRegistry
from attnstore_vllm.plan import SaveSpec

log = structlog.get_logger("attnstore_vllm.save")

# A key another put holds, or one deleted while a read lease still covers it (a bad chunk
# a load just dropped: its lease ends within the client's 20 ms release delay), is
# "in progress"; asking again a little later stores it or finds it stored.
PUT_ATTEMPTS = 4
PUT_RETRY_SECONDS = 0.05


class ChunkSaver:
    def __init__(
        self,
        store: KVStoreClient,
        registry: NamespaceRegistry,
        dtype_name: str,
        max_pending_bytes: int,
        tp_rank: int,
    ) -> None:
        self._store = store
        self._rank = tp_rank
        self._registry = registry
        self._dtype_name = dtype_name
        self._max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        self._lock = threading.Lock()  # _pending_bytes: vLLM's thread adds, the loop subtracts
        self._gathered: dict[int, list[torch.Tensor]] = {}  # save index -> per layer [2, H, T, D]

    def gather_layer(self, saves: Sequence[SaveSpec], views: KVViews) -> None:
        """Copies this layer of every chunk to save out of the blocks (layers come in order)."""
        for index, spec in enumerate(saves):
            blocks = torch.tensor(spec.block_ids, device=views[0].device)
            self._gathered.setdefault(index, []).append(gather_blocks(views, blocks).cpu())  # no-op on a CPU

    def submit(self, saves: Sequence[SaveSpec], num_layers: int, skip_requests: set[str]) -> None:
        """Hands this step's whole chunks to the daemon in the background."""
        gathered, self._gathered = self._gathered, {}
        for index, spec in enumerate(saves):
            layers = gathered.get(index, [])
            if spec.req_id in skip_requests or len(layers) != num_layers:
                continue
            size = sum(layer.numel() * layer.element_size() for layer in layers)
            with self._lock:
                if self._pending_bytes + size > self._max_pending_bytes:
                    metrics.SAVES_DROPPED.inc()
                    continue
                self._pending_bytes += size
            if not self._registry.ensure(spec.namespaces[self._rank]):
                self._release(size)
                metrics.SAVE_ERRORS.inc()
                continue
            self._store.submit(self._save(spec, layers, size))

    async def _save(self, spec: SaveSpec, layers: list[torch.Tensor], size: int) -> None:
        started = time.perf_counter()
        try:
            chunk = await asyncio.to_thread(self._encode, spec, layers)
            for _ in range(PUT_ATTEMPTS):
                namespace, key = spec.namespaces[self._rank], spec.keys[self._rank]
                result = await self._store.aio.put_chunks(namespace, [(key, chunk)])
                if not result.in_progress:
                    break
                await asyncio.sleep(PUT_RETRY_SECONDS)
            if result.stored:
                metrics.SAVED_CHUNKS.inc()
                metrics.SAVE_BYTES.inc(len(chunk))
        except Exception as exc:  # noqa: BLE001 -- a lost save is a future miss, nothing more
            metrics.SAVE_ERRORS.inc()
            log.warning("saving a chunk to the daemon failed", error=repr(exc))
        finally:
            self._release(size)
            metrics.SAVE_SECONDS.inc(time.perf_counter() - started)

    def _encode(self, spec: SaveSpec, layers: list[torch.Tensor]) -> bytes:
        _, heads, tokens, head_dim = layers[0].shape
        return encode_chunk(
            namespace=spec.namespaces[self._rank],
            key=spec.keys[self._rank],
            dtype=self._dtype_name,
            kv_heads=heads,
            tokens=tokens,
            head_dim=head_dim,
            base_position=spec.base_position,
            layers=[(_raw(layer[0]), _raw(layer[1])) for layer in layers],
        )

    def _release(self, size: int) -> None:
        with self._lock:
            self._pending_bytes -= size


def _raw(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor (any dtype, bf16 included), without a copy."""
    return memoryview(tensor.contiguous().view(torch.uint8).numpy())
