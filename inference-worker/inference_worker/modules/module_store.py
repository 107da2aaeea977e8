"""Module KV in the daemon: each module's KV is chunks like any prompt's, in the tenant's
namespace, keyed from the module's key (tenant namespace, schema digest, module path; see
attnstore.prompt_modules.identity), so it lives in the same DRAM and SSD tiers and is
evicted by the same policies. A module whose chunks are not all stored is encoded (a
forward pass over its tokens alone) and saved again: eviction costs a recompute, never a
failed request. A stored module is read layer by layer while the prompt is computed
(layer-wise loading, as turns load their prefix KV); a read that fails after the lookup
found every chunk makes the turn compute the modules' tokens instead (engine recompute),
and deletes the module's chunks, so that its next use encodes and saves it again.

Store format: the model's dtype (exact), or a narrower one (`store_dtype`, bf16: half the
bytes a module turn reads from the daemon), converted to the model's in the read's one copy;
a module encoded now is served rounded through that format too, so a prompt's tokens do
not depend on whether its modules were read or encoded. A narrower format lives in a
namespace of its own (the daemon checks each chunk's dtype against its namespace), derived
from the tenant's: another tenant's never names it, and the model's dtype is never read
as it.

Protection: every module served or encoded is hinted PROTECT (replace=false) for the
daemon's hint TTL, so under the `lookahead` policy a schema in use outlives unhinted
chunks. The scheduler re-protects a registered schema's modules by encoding it again
(cheap: every module is then a store hit).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from enum import Enum

import blake3
import structlog
import torch

from attnstore.chunks.keys import NAMESPACE_BYTES
from attnstore.kvstore_client import AsyncKVStoreClient, HintAction, LayerPiece
from attnstore.prompt_modules import module_chunk_keys
from inference_worker.engine.engine import Engine
from inference_worker.kv_codec import DTYPE_NAMES, KVShapeError, layer_from_pieces
from inference_worker.kv_saver import ChunkRun, ChunkSaver
from inference_worker.layerwise_cache import PrefixLoadFailed
from inference_worker.modules.module_cache import ModuleCache
from inference_worker.modules.module_kv import LayerFeed, ModuleKV, encode_module
from inference_worker.namespaces import Namespaces
from inference_worker.turn_types import KVSource

log = structlog.get_logger("inference_worker.modules.module_store")

_FORMAT_DOMAIN = b"attnstore/module-format/v1\0"  # the namespace of module KV in a narrower dtype


class Origin(Enum):
    STORED = "stored"  # read from the daemon
    ENCODED = "encoded"  # computed now (first use, or evicted), and saved


@dataclass(frozen=True)
class ModuleSpec:
    """What a module's KV is: its key and the tokens and positions it is encoded at."""

    key: bytes
    token_ids: tuple[int, ...]
    positions: tuple[int, ...]
    # Tokens and positions in its attention span when encoded, not in its KV (module_kv.py).
    context_ids: tuple[int, ...] = ()
    context_positions: tuple[int, ...] = ()


class ModuleStore:
    def __init__(
        self,
        engine: Engine,
        kvstore: AsyncKVStoreClient | None,
        saver: ChunkSaver | None,
        namespaces: Namespaces,
        *,
        timeout_seconds: float,
        store_dtype: torch.dtype | None = None,
        cache_bytes: int = 0,
    ) -> None:
        """`timeout_seconds`: the longest wait for the daemon's lookup or read of one module.
        `store_dtype`: the format of module KV in the store (None: the model's).
        `cache_bytes`: module KV kept in memory, served instead of read (module_cache.py)."""
        self.cache = ModuleCache(cache_bytes)
        self.store_dtype = None if store_dtype == engine.kv.k.dtype else store_dtype
        self.engine = engine
        self.kvstore = kvstore
        self.saver = saver
        self.namespaces = namespaces
        self.timeout_seconds = timeout_seconds
        self._tasks: set[asyncio.Task[None]] = set()

    def stored_source(self, source: KVSource) -> KVSource:
        """The namespace that holds the tenant's (`source`'s) module KV in this store's format."""
        if self.store_dtype is None:
            return source
        name = DTYPE_NAMES[self.store_dtype]
        namespace = blake3.blake3(_FORMAT_DOMAIN + source.namespace + name.encode()).digest(NAMESPACE_BYTES)
        return KVSource(namespace, source.chunk_tokens, dtype=name)

    def chunk_keys(self, source: KVSource, spec: ModuleSpec) -> list[bytes]:
        """The store keys of the module's chunks, in `stored_source(source)`'s namespace."""
        stored = self.stored_source(source)
        return module_chunk_keys(stored.namespace, spec.key, spec.token_ids, stored.chunk_tokens)

    async def get_all(self, source: KVSource, specs: Sequence[ModuleSpec]) -> list[tuple[ModuleKV, Origin]]:
        """Each module's KV: stored (from this worker's memory when an earlier turn read it,
        else read in the background, layer by layer: a LayerFeed), else encoded and saved
        (in the background). Looked up all at once (a Lookup names one module's chain); the
        stored modules' chunks are protected in one Hint, not one per module (during the
        prompt's forward pass, on the same cores)."""
        found = await asyncio.gather(*(self._get(source, spec) for spec in specs))
        stored = [keys for _, origin, keys in found if origin is Origin.STORED]
        if stored:
            self._background(self._protect(self.stored_source(source), stored))
        return [(module, origin) for module, origin, _ in found]

    async def _get(self, source: KVSource, spec: ModuleSpec) -> tuple[ModuleKV, Origin, list[bytes]]:
        """`get_all` of one module (a stored one not protected yet) and its chunk keys."""
        keys, source = self.chunk_keys(source, spec), self.stored_source(source)
        if self.kvstore is not None and await self._is_stored(self.kvstore, source, keys):
            feed = LayerFeed(
                self.engine.runner.geometry.num_layers, len(spec.token_ids), self.timeout_seconds
            )
            kept = self.cache.get((source.namespace, spec.key))
            if kept is None:
                self._background(self._read(self.kvstore, source, keys, feed, spec.key))
            else:
                feed.put_all(kept)
            return ModuleKV(spec.token_ids, spec.positions, feed), Origin.STORED, keys
        return await self._encode(source, spec, keys), Origin.ENCODED, keys

    async def ensure(self, source: KVSource, spec: ModuleSpec) -> Origin:
        """Makes the module stored, as `get_all` does, without reading it when it is (eager
        encoding and re-protection of a registered schema need no KV)."""
        keys, source = self.chunk_keys(source, spec), self.stored_source(source)
        if self.kvstore is not None and await self._is_stored(self.kvstore, source, keys):
            self._background(self._protect(source, [keys]))
            return Origin.STORED
        await self._encode(source, spec, keys)
        return Origin.ENCODED

    async def _is_stored(self, client: AsyncKVStoreClient, source: KVSource, keys: Sequence[bytes]) -> bool:
        try:
            return await asyncio.wait_for(self._stored(client, source, keys), self.timeout_seconds)
        except Exception as exc:  # noqa: BLE001 -- a store failure means encode, never a failed turn
            log.warning("looking a module up failed; encoding it", error=repr(exc))
            return False

    async def _encode(self, source: KVSource, spec: ModuleSpec, keys: Sequence[bytes]) -> ModuleKV:
        """The module encoded now, its save (and protection) started."""
        module = await encode_module(
            self.engine,
            spec.token_ids,
            spec.positions,
            source.namespace,
            (spec.context_ids, spec.context_positions),
        )
        stored = module.kv
        if self.store_dtype is not None:
            stored = [(k.to(self.store_dtype), v.to(self.store_dtype)) for k, v in module.kv]
            dtype = self.engine.kv.k.dtype
            module = ModuleKV(
                module.token_ids, module.positions, [(k.to(dtype), v.to(dtype)) for k, v in stored]
            )
        if self.saver is not None:
            self.saver.save(
                source,
                [ChunkRun(keys, stored, spec.positions[0])],
                before_put=lambda: self.namespaces.ensure_registered(source),
            )
            self._background(self._protect(source, [keys]))
        return module

    def _background(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)  # the loop holds tasks weakly
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Waits for the saves (and their protection hints) started so far."""
        if self.saver is not None:
            await self.saver.drain()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _stored(self, client: AsyncKVStoreClient, source: KVSource, keys: Sequence[bytes]) -> bool:
        """Whether every chunk of the module is stored (its saves settled first)."""
        if not await self.namespaces.ensure_registered(source):
            return False
        if self.saver is not None:
            await self.saver.settle(source.namespace, keys, self.timeout_seconds)
        found = await client.lookup(source.namespace, keys)
        return found.prefix_length == len(keys)

    async def _read(
        self, client: AsyncKVStoreClient, source: KVSource, keys: Sequence[bytes], feed: LayerFeed, key: bytes
    ) -> None:
        """Puts every layer of the module's chunks (`key`'s) into `feed` as it arrives, and
        the whole KV into the cache; fails the feed (never raises) on any error: the turn then
        computes the module's tokens instead."""
        row: list[LayerPiece] = []
        layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        layer = 0
        try:
            async with contextlib.aclosing(client.iter_layers(source.namespace, keys)) as pieces:
                async for piece in pieces:
                    row.append(piece)
                    if len(row) == len(keys):
                        k, v = layer_from_pieces(
                            row, device=self.engine.runner.device, verify=True, dtype=self.engine.kv.k.dtype
                        )
                        feed.put(layer, k, v)  # [kv_heads, tokens, D]
                        layers.append((k, v))
                        row, layer = [], layer + 1
            if layer != len(feed):
                raise KVShapeError(f"a module's chunks hold {layer} layers")
            self.cache.put((source.namespace, key), layers)
        except asyncio.CancelledError:
            feed.fail(PrefixLoadFailed("the module's read was cancelled"))
            raise
        except Exception as exc:  # noqa: BLE001
            log.warning("reading a module failed; its tokens are computed", error=repr(exc))
            feed.fail(exc)
            with contextlib.suppress(Exception):  # so that the next use encodes it and saves it again
                await client.delete(source.namespace, keys)

    async def _protect(self, source: KVSource, modules: Sequence[Sequence[bytes]]) -> None:
        """Hints the modules' chunks (each module's keys) PROTECT in one call, once their
        saves land; a failure only costs a re-encode later."""
        if self.kvstore is None:
            return
        try:
            if self.saver is not None:
                keys = [key for chain in modules for key in chain]
                await self.saver.settle(source.namespace, keys, self.timeout_seconds)
            await self.kvstore.hint(
                source.namespace, [(list(chain), HintAction.PROTECT, 0) for chain in modules]
            )
        except Exception as exc:  # noqa: BLE001
            log.debug("protecting module chunks failed", error=repr(exc))
