"""A blocking client for threads without an event loop (tests, scripts, benchmarks).

It runs an AsyncKVStoreClient on a private event loop in a daemon thread and waits for
each call, so the two clients cannot drift apart: this file holds no protocol logic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from attnstore.chunks.format import ChunkLayout
from attnstore.kvstore.v1 import kvstore_pb2
from attnstore.kvstore_client.async_client import AsyncKVStoreClient
from attnstore.kvstore_client.location_cache import DEFAULT_ENTRIES as DEFAULT_LOCATION_ENTRIES
from attnstore.kvstore_client.pieces import PutChunks
from attnstore.kvstore_client.results import (
    ChunkData,
    ClientStats,
    HintAction,
    HintResult,
    LayerPiece,
    LookupResult,
    PutResult,
)
from attnstore.security.credentials import ClientCredentials

T = TypeVar("T")


class KVStoreClient:
    """Same methods and semantics as AsyncKVStoreClient, blocking; safe to share between
    threads (calls interleave on the private loop). `close()` it, or use `with`."""

    def __init__(
        self,
        address: str,
        *,
        use_shm: bool = True,
        timeout_seconds: float = 10.0,
        verify_checksums: bool = True,
        shm_dir: Path | None = None,
        credentials: ClientCredentials | None = None,
        location_cache_entries: int = DEFAULT_LOCATION_ENTRIES,
        use_data_plane: bool = True,
        data_plane_tls: ssl.SSLContext | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kvstore-client", daemon=True)
        self._thread.start()

        async def create() -> AsyncKVStoreClient:  # grpc.aio binds a channel to the running loop
            return AsyncKVStoreClient(
                address,
                use_shm=use_shm,
                timeout_seconds=timeout_seconds,
                verify_checksums=verify_checksums,
                shm_dir=shm_dir,
                credentials=credentials,
                location_cache_entries=location_cache_entries,
                use_data_plane=use_data_plane,
                data_plane_tls=data_plane_tls,
            )

        try:
            self._client = self._run(create())
        except BaseException:
            self._stop_loop()
            raise
        self.address = address

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._stop_loop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def open_shm(self) -> bool:
        return self._run(self._client.open_shm())

    def transport(self) -> str:
        return self._run(self._client.transport())

    def client_stats(self) -> ClientStats:
        return self._client.client_stats()

    def register_namespace(
        self,
        namespace: bytes,
        *,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        chunk_tokens: int,
        dtype: str,
        model_label: str = "",
    ) -> int:
        return self._run(
            self._client.register_namespace(
                namespace,
                num_layers=num_layers,
                kv_heads=kv_heads,
                head_dim=head_dim,
                chunk_tokens=chunk_tokens,
                dtype=dtype,
                model_label=model_label,
            )
        )

    def lookup(self, namespace: bytes, keys: Sequence[bytes], *, promote: bool = False) -> LookupResult:
        return self._run(self._client.lookup(namespace, keys, promote=promote))

    def put_chunks(
        self, namespace: bytes, chunks: PutChunks, *, durable: bool = False, ttl_seconds: int = 0
    ) -> PutResult:
        return self._run(self._client.put_chunks(namespace, chunks, durable=durable, ttl_seconds=ttl_seconds))

    def get_chunks(
        self, namespace: bytes, keys: Sequence[bytes], *, layer_start: int = 0, layer_end: int = 0
    ) -> list[ChunkData]:
        return self._run(
            self._client.get_chunks(namespace, keys, layer_start=layer_start, layer_end=layer_end)
        )

    def get_chunks_into(
        self, namespace: bytes, keys: Sequence[bytes], outs: Sequence[memoryview]
    ) -> list[ChunkLayout]:
        return self._run(self._client.get_chunks_into(namespace, keys, outs))

    def get_whole_chunks(self, namespace: bytes, keys: Sequence[bytes]) -> list[bytes]:
        return self._run(self._client.get_whole_chunks(namespace, keys))

    def iter_layers(
        self, namespace: bytes, keys: Sequence[bytes], *, layer_start: int = 0, layer_end: int = 0
    ) -> list[LayerPiece]:
        """Every layer piece, in the order AsyncKVStoreClient.iter_layers yields them; each
        piece's data is owned (views of the arena are copied before the lease ends)."""

        async def collect() -> list[LayerPiece]:
            pieces = self._client.iter_layers(namespace, keys, layer_start=layer_start, layer_end=layer_end)
            return [
                dataclasses.replace(piece, data=bytes(piece.data)) if isinstance(piece.data, memoryview) else piece
                async for piece in pieces
            ]

        return self._run(collect())

    def delete(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        return self._run(self._client.delete(namespace, keys))

    def pin(self, namespace: bytes, keys: Sequence[bytes], ttl_seconds: int = 0) -> int:
        return self._run(self._client.pin(namespace, keys, ttl_seconds))

    def unpin(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        return self._run(self._client.unpin(namespace, keys))

    def hint(
        self,
        namespace: bytes,
        entries: Sequence[tuple[Sequence[bytes], HintAction, int] | tuple[Sequence[bytes], HintAction, int, float]],
        *,
        replace: bool = False,
        ttl_seconds: int = 0,
        source: str = "",
    ) -> HintResult:
        return self._run(self._client.hint(namespace, entries, replace=replace, ttl_seconds=ttl_seconds, source=source))

    def stats(self) -> kvstore_pb2.StatsResponse:
        return self._run(self._client.stats())
