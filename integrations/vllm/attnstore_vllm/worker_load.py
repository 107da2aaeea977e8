"""One step's loads: a task on the store loop reads every hit chunk layer-major (layer 0 of
each chunk, then layer 1...) and scatters each layer into vLLM's blocks, so the forward
pass, waiting per layer, computes layer l while layer l+1 arrives.

    states of a layer:  pending --(every load wrote it, or a load failed)--> ready

A failed load (daemon gone, chunk missing, corrupt or of another shape, a layer that does
not arrive within `layer_timeout_seconds`) marks its request's written blocks invalid: vLLM
recomputes them. Chunks that proved bad are deleted, so the recompute can store them again
(a put of a key the daemon holds would keep the bad copy).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
import warnings
from collections.abc import Sequence

import structlog
import torch

from attnstore.chunks.format import ChunkFormatError, ChunkLayout, verify_layer
from attnstore.kvstore_client import KVStoreClient
from attnstore_vllm import metrics
from attnstore_vllm.kv_layout import KVViews, scatter_blocks
from attnstore_vllm.plan import LoadSpec

log = structlog.get_logger("attnstore_vllm.load")

# torch warns that a tensor over read-only bytes (a view of the leased arena) is writable
# through torch; these tensors are only ever copy sources.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


class BadChunkError(ValueError):
    """A chunk's bytes do not fit this model's layer (another shape, dtype or length)."""


class LoadJob:
    def __init__(
        self,
        loads: Sequence[LoadSpec],
        views: Sequence[KVViews],  # per model layer
        dtype: torch.dtype,
        store: KVStoreClient,
        layer_timeout_seconds: float,
        tp_rank: int,
    ) -> None:
        self._loads = loads
        self._rank = tp_rank
        self._views = views
        self._dtype = dtype
        self._store = store
        self._timeout = layer_timeout_seconds
        self._ready = [threading.Event() for _ in views]
        self._remaining = [len(loads)] * len(views)
        self.failed: set[str] = set()  # request ids
        self._started = time.perf_counter()
        self._future: concurrent.futures.Future[None] = store.submit(self._run())

    def wait_for_layer(self, layer: int) -> None:
        if not self._ready[layer].wait(self._timeout):
            log.warning("a layer's KV did not arrive in time; recomputing", layer=layer)
            self._abandon()

    def finish(self) -> set[int]:
        """Ends the job (cancelling what still runs, so nothing writes into the blocks
        afterwards) and returns the blocks whose load failed."""
        try:
            self._future.result(self._timeout)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            self._abandon()
        return {
            block for spec in self._loads if spec.req_id in self.failed for block in spec.written_block_ids
        }

    def _abandon(self) -> None:
        self.failed.update(spec.req_id for spec in self._loads)
        self._future.cancel()
        with contextlib.suppress(concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            self._future.result(self._timeout)  # the task stops at its next await
        for event in self._ready:
            event.set()

    async def _run(self) -> None:
        try:
            await asyncio.gather(*(self._load(spec) for spec in self._loads))
        finally:
            for event in self._ready:  # cancelled: nobody waits for what will never come
                event.set()
        metrics.LOAD_SECONDS.inc(time.perf_counter() - self._started)

    async def _load(self, spec: LoadSpec) -> None:
        done = 0  # layers of this load that are in place (or given up)
        namespace, keys = spec.namespaces[self._rank], spec.keys[self._rank]
        last = len(keys) - 1
        try:
            pieces = self._store.aio.iter_layers(namespace, keys)
            async with contextlib.aclosing(pieces) as layers:
                async for piece in layers:
                    self._write(spec, piece.chunk_index, piece.layer, piece.layout, piece.data)
                    if piece.chunk_index == last:
                        self._layer_done(piece.layer)
                        done += 1
            metrics.LOADED_CHUNKS.inc(len(keys))
        except asyncio.CancelledError:
            self.failed.add(spec.req_id)
            raise
        except Exception as exc:  # noqa: BLE001 -- any failure of the store means recompute
            self.failed.add(spec.req_id)
            metrics.LOAD_ERRORS.inc()
            log.warning("loading KV from the daemon failed; vLLM recomputes it", error=repr(exc))
            if isinstance(exc, ValueError):  # ChunkCorruptError, ChunkFormatError, BadChunkError
                with contextlib.suppress(Exception):
                    await self._store.aio.delete(namespace, keys)
        finally:
            for layer in range(done, len(self._views)):
                self._layer_done(layer)

    def _write(
        self, spec: LoadSpec, chunk: int, layer: int, layout: ChunkLayout, data: memoryview | bytes
    ) -> None:
        """Copies one chunk's layer into its blocks, then verifies the bytes it copied."""
        views = self._views[layer]
        _, heads, block_tokens, head_dim = views[0].shape
        device = views[0].device
        per_chunk = len(spec.block_ids) // len(spec.keys[self._rank])
        header = layout.header
        if (header.kv_heads, header.head_dim, header.tokens) != (heads, head_dim, per_chunk * block_tokens):
            raise BadChunkError(f"chunk {header.key.hex()} has another shape than this model's layer")
        source = torch.frombuffer(data, dtype=torch.uint8)
        if source.numel() != header.layer_bytes:
            raise ChunkFormatError(f"layer {layer} of chunk {header.key.hex()} has {source.numel()} bytes")
        tokens = source.view(self._dtype).view(2, heads, header.tokens, head_dim)
        skip = spec.skip_blocks if chunk == 0 else 0
        blocks = spec.block_ids[chunk * per_chunk + skip : (chunk + 1) * per_chunk]
        layer_tokens = tokens[:, :, skip * block_tokens :].to(device)  # no-op on a CPU
        scatter_blocks(views, torch.tensor(blocks, device=device), layer_tokens)
        verify_layer(layout, layer, data)  # while the copied bytes are still in cache
        metrics.LOAD_BYTES.inc(header.layer_bytes)

    def _layer_done(self, layer: int) -> None:
        self._remaining[layer] -= 1
        if self._remaining[layer] <= 0:
            self._ready[layer].set()
