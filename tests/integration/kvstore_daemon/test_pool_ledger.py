"""The pool's ledger on a real redis-server: daemons register and heartbeat, candidates
come by locality and room within the lending limits, and a daemon that stops
heartbeating is forgotten (its stale score dropped) after its TTL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from attnstore.pool_ledger import DROPPED_TTL_SECONDS, DaemonEntry, LendingLimits, PoolLedger, read_lendable
from attnstore.server.redis_process import RedisProcess
from kvstore_daemon.settings import DaemonSettings

GB = 10**9
LIMITS = LendingLimits(own_floor_fraction=0.2, max_lent_fraction=0.5, replace_borrowed=False)


def entry(
    daemon_id: str,
    node: str,
    free_gb: float,
    *,
    lent_gb: float = 0,
    capacity_gb: float = 10,
    pinned_gb: float = 0,
) -> DaemonEntry:
    return DaemonEntry(
        daemon_id=daemon_id, node=node, grpc_address=f"{node}:50051", data_plane_address=f"{node}:50052",
        capacity_bytes=int(capacity_gb * GB), free_bytes=int(free_gb * GB), lent_bytes=int(lent_gb * GB),
        pinned_lent_bytes=int(pinned_gb * GB),
    )  # fmt: skip


def test_lendable_bytes_keep_the_floor_and_the_ceiling() -> None:
    limits = LIMITS
    assert limits.lendable_bytes(entry("a", "n", free_gb=6)) == 4 * GB  # 6 free - 2 floor
    assert limits.lendable_bytes(entry("a", "n", free_gb=9, lent_gb=4)) == 1 * GB  # 5 ceiling - 4 lent
    assert limits.lendable_bytes(entry("a", "n", free_gb=1)) == 0  # below its floor: lends nothing


def test_a_replacing_lender_counts_what_it_lends_as_room_but_not_the_pinned_part() -> None:
    """A lender that replaces borrowed chunks may evict them for a newer loan, except the
    pinned ones (far segments' KV, lent_chunks.py): at its ceiling, pinned lent bytes are no room."""
    replacing = LendingLimits(own_floor_fraction=0.2, max_lent_fraction=0.5, replace_borrowed=True)
    assert replacing.lendable_bytes(entry("a", "n", free_gb=5, lent_gb=5)) == 5 * GB  # all of it replaceable
    assert replacing.lendable_bytes(entry("a", "n", free_gb=5, lent_gb=5, pinned_gb=3)) == 2 * GB
    assert replacing.lendable_bytes(entry("a", "n", free_gb=5, lent_gb=5, pinned_gb=5)) == 0


@pytest.fixture
def redis_server(tmp_path: Path, redis_installed: None) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_candidates_by_locality_then_room_and_dead_daemons_are_forgotten(redis_server: RedisProcess) -> None:
    server = redis_server

    async def scenario() -> None:
        client = aioredis.Redis.from_url(server.url)
        ledger = PoolLedger(client, heartbeat_ttl_seconds=2.0, limits=LIMITS)
        me = entry("me", "node-a", free_gb=0)
        for peer in (me, entry("far-big", "node-b", 8), entry("far-small", "node-c", 4),
                     entry("near", "node-a", 3), entry("full", "node-d", 1)):  # fmt: skip
            await ledger.heartbeat(peer)
        found = await ledger.candidates(me, size_bytes=500_000_000, count=3)
        assert [e.daemon_id for e in found] == ["near", "far-big", "far-small"]  # never itself, nor "full"
        assert (await ledger.candidates(me, size_bytes=5 * GB, count=3))[0].daemon_id == "far-big"

        await ledger.forget("near")  # a clean stop leaves at once
        assert [e.daemon_id for e in await ledger.candidates(me, 1, 5)] == ["far-big", "far-small"]

        await asyncio.sleep(1.2)
        await ledger.heartbeat(entry("far-small", "node-c", 4))  # only far-small keeps beating
        await asyncio.sleep(1.2)  # far-big's TTL has passed, far-small's not
        assert [e.daemon_id for e in await ledger.candidates(me, 1, 5)] == ["far-small"]
        assert b"far-big" not in await client.zrange(
            "attnstore:pool:lendable", 0, -1
        )  # its stale score is gone
        assert await ledger.entry("far-big") is None
        await ledger.heartbeat(entry("far-big", "node-b", 8))  # a restarted daemon comes back
        assert [e.daemon_id for e in await ledger.candidates(me, 1, 5)] == ["far-big", "far-small"]
        await client.aclose()

    asyncio.run(scenario())


def test_a_worker_reads_the_room_of_live_daemons_only(redis_server: RedisProcess) -> None:
    """read_lendable (a long turn's home, synchronous): each named daemon's score as its own
    heartbeat wrote it; one gone (stopped, or past its TTL) or never seen is left out."""

    async def beat() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        ledger = PoolLedger(client, heartbeat_ttl_seconds=60.0, limits=LIMITS)
        for member in (entry("a", "n", free_gb=6), entry("b", "n", free_gb=9, lent_gb=4), entry("c", "n", 6)):
            await ledger.heartbeat(member)
        await ledger.forget("c")
        await client.aclose()

    asyncio.run(beat())
    client = redis.Redis.from_url(redis_server.url)
    assert read_lendable(client, ["a", "b", "c", "never"]) == {"a": 4 * GB, "b": 1 * GB}
    client.delete("attnstore:pool:daemon:b")  # as its TTL does without a heartbeat: the score stays
    assert read_lendable(client, ["a", "b"]) == {"a": 4 * GB}
    client.close()


def test_the_schedulers_reader_sees_what_the_daemons_wrote_and_ranks_nothing(
    redis_server: RedisProcess,
) -> None:
    """The scheduler's ledger has no lending limits of its own to disagree with a daemon's:
    it reads the entries the daemons wrote (with their own settings) and leaves ranking
    lenders to them."""
    daemon_limits = DaemonSettings().lending_limits

    async def scenario() -> None:
        daemon_client, reader_client = (aioredis.Redis.from_url(redis_server.url) for _ in range(2))
        daemon = PoolLedger(daemon_client, 2.0, daemon_limits)
        reader = PoolLedger.reader(reader_client)
        written = [entry("a", "node-a", free_gb=6), entry("b", "node-b", free_gb=9, lent_gb=4)]
        for member in written:
            await daemon.heartbeat(member)
        assert sorted(await reader.members(), key=lambda e: e.daemon_id) == written
        assert await reader.entry("b") == await daemon.entry("b") == written[1]
        with pytest.raises(RuntimeError, match="read-only ledger"):
            await reader.candidates(written[0], 1, 1)
        with pytest.raises(RuntimeError, match="read-only ledger"):
            await reader.heartbeat(written[0])
        await daemon_client.aclose()
        await reader_client.aclose()

    asyncio.run(scenario())


def test_debts_are_each_creditors_absolute_values_and_expire_with_it(redis_server: RedisProcess) -> None:
    """Each lender worker publishes what it holds per borrower, whole (pool_debts.py): a new
    write replaces the last, an empty one removes its edges, a clean stop withdraws them and
    a creditor that stops writing loses them when its TTL passes."""
    from attnstore.debt_graph import plan_swaps
    from attnstore.pool_debts import publish_debts, read_debts, withdraw_debts

    reader = redis.Redis.from_url(redis_server.url)

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        await publish_debts(client, "b", {"a": 300, "c": 50}, ttl_seconds=60)
        await publish_debts(client, "b", {"a": 500}, ttl_seconds=60)  # replaces: c paid back
        await publish_debts(client, "a", {"b": 400}, ttl_seconds=1.0)
        await publish_debts(client, "c", {"a": 100}, ttl_seconds=60)
        await publish_debts(client, "c", {}, ttl_seconds=60)  # holds nothing now
        assert read_debts(reader) == {("a", "b"): 500, ("b", "a"): 400}
        [swap] = plan_swaps(read_debts(reader), min_swap_bytes=100)
        assert swap.size_bytes == 400
        await asyncio.sleep(1.2)  # a's TTL passed without a write (killed): its edges are gone
        assert read_debts(reader) == {("a", "b"): 500}
        assert reader.smembers("attnstore:pool:creditors") == {b"b"}  # and it left the index
        await withdraw_debts(client, "b")  # a clean stop
        assert read_debts(reader) == {}
        await client.aclose()

    asyncio.run(scenario())
    reader.close()


def test_dropped_chunks_reach_their_borrower_node_once_and_expire(redis_server: RedisProcess) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        ledger = PoolLedger(client, heartbeat_ttl_seconds=2.0, limits=LIMITS)
        await ledger.report_dropped(
            "lender-1:50051", [("node-b", b"k1"), ("node-c", b"k2"), ("node-b", b"k3")]
        )
        await ledger.report_dropped("lender-2:50051", [("node-b", b"k4")])
        assert await ledger.take_dropped("node-b") == [
            ("lender-1:50051", b"k1"), ("lender-1:50051", b"k3"), ("lender-2:50051", b"k4"),
        ]  # fmt: skip
        assert await ledger.take_dropped("node-b") == []  # taken once
        assert (
            0 < await client.ttl("attnstore:pool:dropped:node-c") <= DROPPED_TTL_SECONDS
        )  # a gone borrower's list expires
        assert await ledger.take_dropped("node-c") == [("lender-1:50051", b"k2")]
        await client.aclose()

    asyncio.run(scenario())
