"""The KV-store daemon's client SDK: `AsyncKVStoreClient` for asyncio code (the
inference worker, the scheduler), `KVStoreClient` for blocking code (tests, scripts,
benchmarks). Both move chunk bytes through shared memory on the daemon's node, over the
daemon's data plane elsewhere, and over gRPC when there is none."""

from attnstore.kvstore_client.async_client import MAX_MESSAGE_BYTES, AsyncKVStoreClient
from attnstore.kvstore_client.pieces import DaemonProtocolError, PutChunks
from attnstore.kvstore_client.results import (
    ChunkData,
    ClientStats,
    HintAction,
    HintResult,
    LayerPiece,
    LookupResult,
    PutResult,
    Tier,
)
from attnstore.kvstore_client.sync_client import KVStoreClient
from attnstore.kvstore_client.writes import WRITE_PIECE_BYTES

__all__ = [
    "MAX_MESSAGE_BYTES",
    "WRITE_PIECE_BYTES",
    "AsyncKVStoreClient",
    "ChunkData",
    "ClientStats",
    "DaemonProtocolError",
    "HintAction",
    "HintResult",
    "KVStoreClient",
    "LayerPiece",
    "LookupResult",
    "PutChunks",
    "PutResult",
    "Tier",
]
