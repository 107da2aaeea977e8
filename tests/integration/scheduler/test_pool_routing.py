"""Pool-aware routing against two real daemons on loopback ("node-a", "node-b") sharing a
ledger in a real Redis: a session whose chunks node-a's daemon placed on node-b is routed
to node-b (its worker reads them from local memory); a session still on node-a stays;
once node-b dies and the ledger forgets it, the session goes back to node-a."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis
from async_polling import wait_until
from filler_chunks import write_filler
from running_daemon import running_daemon
from scheduler_stack import RedisFactory
from service_probes import free_port

from attnstore.kvstore_client import AsyncKVStoreClient, Tier
from attnstore.pool_ledger import PoolLedger
from attnstore_scheduler.pool_routing import PoolRouting
from attnstore_scheduler.settings import NodeSpec
from attnstore_scheduler.worker_registry import WorkerRegistry

pytestmark = pytest.mark.timeout(120)

KiB = 1024
MiB = 1024 * KiB
NAMESPACE = b"pool-routing-ns!"
LAYOUT = {
    "num_layers": 4,
    "kv_heads": 2,
    "head_dim": 64,
    "chunk_tokens": 16,
    "dtype": "float16",
}  # 36 KiB chunks
SESSION_CHUNKS = 3
FILLER_CHUNKS = 60  # more than node-a's DRAM (8 blocks) and SSD (about 28 chunks) hold
HEARTBEAT_SECONDS = 0.3


async def on_peer(daemon: AsyncKVStoreClient, keys: list[bytes]) -> bool:
    return (await daemon.lookup(NAMESPACE, keys)).tiers == [Tier.PEER] * len(keys)


async def test_a_session_goes_to_the_node_that_holds_its_kv(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    redis = redis_factory()
    ledger = {"POOL_REDIS_URL": redis.url, "POOL_HEARTBEAT_SECONDS": HEARTBEAT_SECONDS}
    small = {
        "DRAM_BLOCK_BYTES": 128 * KiB, "MAX_CHUNK_BYTES": 512 * KiB, "SSD_RESERVED_BYTES": 0, "EVICTION_POLICY": "lru",
        "POOL_CAPACITY_BYTES": 64 * MiB, "POOL_NODE": "node-a", **ledger,
    }  # fmt: skip
    with (
        running_daemon(
            tmp_path / "b", dram_bytes=64 * MiB, ssd_bytes=64 * MiB,
            settings={"DATA_PLANE_PORT": free_port(), "POOL_NODE": "node-b", **ledger},
        ) as node_b,
        running_daemon(tmp_path / "a", dram_bytes=MiB, ssd_bytes=MiB, settings=small) as node_a,
    ):  # fmt: skip
        registry = WorkerRegistry(
            max_turns_per_worker=1,
            health_interval_seconds=1,
            health_timeout_seconds=1,
            daemon_timeout_seconds=2,
        )
        registry.set_topology([
            NodeSpec(name="node-a", daemon_address=node_a.address, worker_addresses=("127.0.0.1:9",)),
            NodeSpec(name="node-b", daemon_address=node_b.address, worker_addresses=("127.0.0.1:10",)),
        ])  # fmt: skip
        client = aioredis.Redis.from_url(redis.url)
        routing = PoolRouting(registry, PoolLedger.reader(client), min_share=1.0)
        try:
            async with AsyncKVStoreClient(node_a.address, use_shm=False) as daemon_a:
                keys = await write_filler(daemon_a, NAMESPACE, FILLER_CHUNKS, **LAYOUT, seed=1)
                session, recent = keys[:SESSION_CHUNKS], keys[-SESSION_CHUNKS:]
                await wait_until(
                    lambda: on_peer(daemon_a, session),
                    "the session's chunks placed on node-b",
                    interval_seconds=0.1,
                )
                assert (await daemon_a.lookup(NAMESPACE, recent)).tiers == [Tier.DRAM] * SESSION_CHUNKS

            assert await routing.home("node-a", NAMESPACE, session) == "node-b"
            assert await routing.home("node-a", NAMESPACE, recent) == "node-a"
            assert await routing.home(None, NAMESPACE, session) is None  # a new session: anywhere

            node_b.kill9()  # the lookup on node-a still names it; the ledger forgets it

            async def back_home() -> bool:
                return await routing.home("node-a", NAMESPACE, session) == "node-a"

            await wait_until(back_home, "the ledger to forget node-b", interval_seconds=0.1)
        finally:
            await registry.close()
            await client.aclose()
