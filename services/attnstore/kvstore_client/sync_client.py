"""A blocking client for threads without an event loop (tests, scripts, benchmarks).

It runs an AsyncKVStoreClient on a private event loop in a daemon thread and waits for
each call, so the two clients cannot drift apart: this file holds no protocol logic.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

from attnstore.chunks.format import ChunkLayout
from attnstore.kvstore.v1 import kvstore_pb2
from attnstore.kvstore_client.async_client import AsyncKVStoreClient, ClientOptions
from attnstore.kvstore_client.background_loop import BackgroundLoop
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

T = TypeVar("T")


class KVStoreClient:
    """Same methods and semantics as AsyncKVStoreClient, blocking; safe to share between
    threads (calls interleave on the private loop). `close()` it, or use `with`."""

    def __init__(self, address: str, **options: Unpack[ClientOptions]) -> None:
        """`options`: AsyncKVStoreClient's keyword arguments, with its defaults."""
        self._loop = BackgroundLoop("kvstore-client")

        async def create() -> AsyncKVStoreClient:  # grpc.aio binds a channel to the running loop
            return AsyncKVStoreClient(address, **options)

        try:
            self._client = self._loop.run(create())
        except BaseException:
            self._loop.stop()
            raise
        self.address = address

    @property
    def aio(self) -> AsyncKVStoreClient:
        """The asyncio client underneath, for coroutines given to `submit` or `call`."""
        return self._client

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Starts `coroutine` (built from `aio`) on the client's loop without waiting: loads
        and saves that overlap the caller's own work."""
        return self._loop.submit(coroutine)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_seconds: float | None = None) -> T:
        """Waits for `coroutine` (built from `aio`); past `timeout_seconds` cancels it and
        raises TimeoutError."""
        return self._loop.run(coroutine, timeout_seconds)

    def close(self, timeout_seconds: float | None = None) -> None:
        """Ends the channel and the loop's thread, each waited for at most `timeout_seconds`."""
        if self._loop.closed:
            return
        try:
            self._loop.run(self._client.close(), timeout_seconds)
        finally:
            self._loop.stop(timeout_seconds)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def open_shm(self) -> bool:
        return self.call(self._client.open_shm())

    def transport(self) -> str:
        return self.call(self._client.transport())

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
        return self.call(
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
        return self.call(self._client.lookup(namespace, keys, promote=promote))

    def put_chunks(
        self, namespace: bytes, chunks: PutChunks, *, durable: bool = False, ttl_seconds: int = 0
    ) -> PutResult:
        return self.call(self._client.put_chunks(namespace, chunks, durable=durable, ttl_seconds=ttl_seconds))

    def get_chunks(
        self, namespace: bytes, keys: Sequence[bytes], *, layer_start: int = 0, layer_end: int = 0
    ) -> list[ChunkData]:
        return self.call(
            self._client.get_chunks(namespace, keys, layer_start=layer_start, layer_end=layer_end)
        )

    def get_chunks_into(
        self, namespace: bytes, keys: Sequence[bytes], outs: Sequence[memoryview]
    ) -> list[ChunkLayout]:
        """Over the data plane, read in this thread (no hop to the client's loop)."""
        layouts = self._client.get_chunks_into_blocking(namespace, keys, outs)
        return layouts if layouts is not None else self.call(self._client.get_chunks_into(namespace, keys, outs))

    def get_whole_chunks(self, namespace: bytes, keys: Sequence[bytes]) -> list[bytes]:
        return self.call(self._client.get_whole_chunks(namespace, keys))

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

        return self.call(collect())

    def delete(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        return self.call(self._client.delete(namespace, keys))

    def pin(self, namespace: bytes, keys: Sequence[bytes], ttl_seconds: int = 0) -> int:
        return self.call(self._client.pin(namespace, keys, ttl_seconds))

    def unpin(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        return self.call(self._client.unpin(namespace, keys))

    def hint(
        self,
        namespace: bytes,
        entries: Sequence[tuple[Sequence[bytes], HintAction, int] | tuple[Sequence[bytes], HintAction, int, float]],
        *,
        replace: bool = False,
        ttl_seconds: int = 0,
        source: str = "",
    ) -> HintResult:
        return self.call(self._client.hint(namespace, entries, replace=replace, ttl_seconds=ttl_seconds, source=source))

    def stats(self) -> kvstore_pb2.StatsResponse:
        return self.call(self._client.stats())
