"""The real daemon the hint pushers' tests push to (tests/ is on sys.path through the root
conftest): 16 one-layer chunks of 32 tokens fill its DRAM, one 64 KiB block each, sessions
of four chained chunks; chunks reach SSD only when DRAM evicts them, and only on
allocation, so which chunks DRAM holds is deterministic."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from running_daemon import running_daemon

from attnstore.chunks.keys import chunk_key
from attnstore.kvstore_client import AsyncKVStoreClient, Tier
from attnstore_scheduler.hint_pusher import HintClient
from attnstore_scheduler.lookahead import NodeCapacity
from kvstore_daemon.launcher import DaemonProcess

KiB, MiB = 1024, 1024 * 1024
NS = bytes(range(16))
# One 32-token chunk of one layer: a 4 KiB header and 32 KiB of K and V, in one 64 KiB block.
LAYOUT = {"num_layers": 1, "kv_heads": 1, "head_dim": 256, "chunk_tokens": 32, "dtype": "float16"}
BLOCK_BYTES = 64 * KiB
CHUNKS_PER_SESSION = 4


@contextmanager
def hint_daemon(root: Path, eviction_policy: str) -> Iterator[DaemonProcess]:
    settings = {
        "dram_block_bytes": BLOCK_BYTES,
        "max_chunk_bytes": BLOCK_BYTES,
        "eviction_policy": eviction_policy,
        "persist_on_commit": "false",
        "dram_high_watermark": 1.0,
        "dram_low_watermark": 1.0,
        "log_level": "WARNING",
    }
    with running_daemon(root, dram_bytes=MiB, ssd_bytes=16 * MiB, settings=settings) as process:
        yield process


@asynccontextmanager
async def registered_client(daemon: DaemonProcess) -> AsyncIterator[AsyncKVStoreClient]:
    """A client of `daemon` with NS registered in LAYOUT."""
    async with AsyncKVStoreClient(daemon.address) as client:
        await client.register_namespace(NS, **LAYOUT)
        yield client


@asynccontextmanager
async def hint_store(root: Path, eviction_policy: str) -> AsyncIterator[AsyncKVStoreClient]:
    """A client of a fresh hint daemon on `eviction_policy`, NS registered."""
    with hint_daemon(root, eviction_policy) as daemon:
        async with registered_client(daemon) as client:
            yield client


@dataclass
class Target:
    node: str
    client: HintClient
    capacity: NodeCapacity | None


def session_keys(session: int) -> list[bytes]:
    keys: list[bytes] = []
    for index in range(CHUNKS_PER_SESSION):
        tokens = range(1000 * session + 32 * index, 1000 * session + 32 * (index + 1))
        keys.append(chunk_key(NS, keys[-1] if keys else None, tokens))
    return keys


async def tiers(kv: AsyncKVStoreClient, session: int) -> list[Tier]:
    return [(await kv.lookup(NS, [key])).tiers[0] for key in session_keys(session)]
