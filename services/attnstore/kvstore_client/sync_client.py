"""A blocking client for threads without an event loop (tests, scripts, benchmarks).

It runs an AsyncKVStoreClient on a private event loop in a daemon thread and waits for
each call (attnstore.sync_facade), so the two clients cannot drift apart: this file holds
no protocol logic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Unpack

from attnstore.chunks.format import ChunkLayout
from attnstore.kvstore_client.async_client import AsyncKVStoreClient, ClientOptions
from attnstore.kvstore_client.results import ClientStats, LayerPiece
from attnstore.sync_facade import SyncFacade, blocking


class KVStoreClient(SyncFacade[AsyncKVStoreClient]):
    """Same methods and semantics as AsyncKVStoreClient, blocking; safe to share between
    threads (calls interleave on the private loop). `close()` it, or use `with`."""

    def __init__(self, address: str, **options: Unpack[ClientOptions]) -> None:
        """`options`: AsyncKVStoreClient's keyword arguments, with its defaults."""
        super().__init__("kvstore-client", lambda: AsyncKVStoreClient(address, **options))
        self.address = address

    open_shm = blocking(AsyncKVStoreClient.open_shm)
    transport = blocking(AsyncKVStoreClient.transport)
    register_namespace = blocking(AsyncKVStoreClient.register_namespace)
    lookup = blocking(AsyncKVStoreClient.lookup)
    put_chunks = blocking(AsyncKVStoreClient.put_chunks)
    get_chunks = blocking(AsyncKVStoreClient.get_chunks)
    get_whole_chunks = blocking(AsyncKVStoreClient.get_whole_chunks)
    delete = blocking(AsyncKVStoreClient.delete)
    pin = blocking(AsyncKVStoreClient.pin)
    unpin = blocking(AsyncKVStoreClient.unpin)
    hint = blocking(AsyncKVStoreClient.hint)
    stats = blocking(AsyncKVStoreClient.stats)

    def get_chunks_into(
        self, namespace: bytes, keys: Sequence[bytes], outs: Sequence[memoryview]
    ) -> list[ChunkLayout]:
        """Over the data plane, read in this thread (no hop to the client's loop)."""
        layouts = self.aio.get_chunks_into_blocking(namespace, keys, outs)
        return layouts if layouts is not None else self.call(self.aio.get_chunks_into(namespace, keys, outs))

    def client_stats(self) -> ClientStats:
        return self.aio.client_stats()

    def iter_layers(
        self, namespace: bytes, keys: Sequence[bytes], *, layer_start: int = 0, layer_end: int = 0
    ) -> list[LayerPiece]:
        """Every layer piece, in the order AsyncKVStoreClient.iter_layers yields them; each
        piece's data is owned (views of the arena are copied before the lease ends)."""

        async def collect() -> list[LayerPiece]:
            pieces = self.aio.iter_layers(namespace, keys, layer_start=layer_start, layer_end=layer_end)
            return [
                dataclasses.replace(piece, data=bytes(piece.data))
                if isinstance(piece.data, memoryview)
                else piece
                async for piece in pieces
            ]

        return self.call(collect())
