"""The pool end to end (issue 21): a local stack of two daemons standing for two nodes
("node-a", "node-b", one ledger in Redis), a worker on each and the scheduler with
pool-aware routing. A session's first turn runs on one node; other KV pushes that turn's
chunks out of its node's tiers onto the other node's daemon (the lender counts them); the
second turn is routed to the lender's node, reuses the KV there, and answers as the same
conversation does in another session."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from filler_chunks import write_filler
from polling import poll
from scheduler_stack import API_KEYS, SCHEDULER_SETTINGS, WORKER_SETTINGS, RedisFactory

from attnstore.api_client import AttnStoreClient
from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore.pool_ledger import DaemonEntry, PoolLedger
from attnstore_cli.local_stack import LocalStack
from attnstore_cli.stack_spec import StackSpec, WorkerSpec

pytestmark = pytest.mark.timeout(600)

KiB = 1024
MiB = 1024 * KiB
NODES = ("node-a", "node-b")
# Each node's tiers hold 2 MiB (the lender lends up to 1 MiB); the tiny model's chunks are
# 8 KiB, the filler's 68 KiB: 48 of them push a first turn's chunks off its node's SSD.
# The filler overflows what the lender may lend too: a lender that replaces borrowed
# chunks (the default) would drop the turn's, placed first, as one LRU over the pool would;
# this test is about routing, so its lender keeps what it took and refuses the rest.
DAEMON_SETTINGS = {
    "dram_capacity_bytes": MiB, "dram_block_bytes": 64 * KiB, "ssd_capacity_bytes": MiB, "ssd_reserved_bytes": 0,
    "max_chunk_bytes": 512 * KiB, "eviction_policy": "lru", "pool_capacity_bytes": 64 * MiB,
    "pool_heartbeat_seconds": 0.3, "pool_peer_timeout_seconds": 60, "pool_replace_borrowed": False,
}  # fmt: skip
FILLER = {"num_layers": 8, "kv_heads": 2, "head_dim": 64, "chunk_tokens": 16, "dtype": "float16"}
FILLER_CHUNKS = 48
QUESTION = "Tell me a long story about the sea, the wind, the ships and the people on them."


def _ledger(url: str) -> list[DaemonEntry]:
    async def members() -> list[DaemonEntry]:
        client = aioredis.Redis.from_url(url)
        try:
            return await PoolLedger.reader(client).members()
        finally:
            await client.aclose()

    return asyncio.run(members())


def test_a_turn_goes_to_the_node_whose_daemon_holds_its_placed_kv(
    tmp_path: Path, redis_factory: RedisFactory, scheduler_model_dir: Path
) -> None:
    redis = redis_factory()
    spec = StackSpec(
        work_dir=tmp_path, model_dir=scheduler_model_dir, daemons=2, daemon_nodes=NODES,
        workers=tuple(WorkerSpec(node, daemon=index) for index, node in enumerate(NODES)),
        redis_url=redis.url, api_keys=API_KEYS,
        daemon_settings={**DAEMON_SETTINGS, "pool_redis_url": redis.url}, worker_settings=WORKER_SETTINGS,
        scheduler_settings={**SCHEDULER_SETTINGS, "pool_routing_min_share": 0.5},
    )  # fmt: skip
    with (
        LocalStack(spec) as stack,
        AttnStoreClient(stack.address, API_KEYS["acme"], timeout_seconds=300) as client,
    ):
        poll(lambda: {e.node for e in _ledger(redis.url)} == set(NODES), "both daemons in the ledger")
        reference = client.create_session().session_id  # the same conversation, in another session
        session = client.create_session().session_id
        first = client.chat(session, QUESTION, max_tokens=8)
        assert client.chat(reference, QUESTION, max_tokens=8).token_ids == first.token_ids
        assert first.stats is not None and first.stats.node in NODES
        home = NODES.index(first.stats.node)
        lender = stack.daemons[1 - home]

        async def fill() -> None:
            async with AsyncKVStoreClient(stack.daemons[home].address) as daemon:
                await write_filler(daemon, b"pool-e2e-filler.", FILLER_CHUNKS, **FILLER)

        asyncio.run(fill())
        poll(
            lambda: any(e.grpc_address == lender.address and e.lent_bytes > 0 for e in _ledger(redis.url)),
            "the first turn's chunks placed on the other node, counted by its daemon",
        )

        second = client.chat(session, "And then?", max_tokens=8)
        assert second.stats is not None
        assert second.stats.node == NODES[1 - home], "the turn should follow its KV to the lender's node"
        assert second.stats.reused_tokens > 0
        expected = client.chat(reference, "And then?", max_tokens=8)
        assert second.token_ids == expected.token_ids
