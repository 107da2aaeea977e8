"""Two daemons on loopback as two "nodes": A's tiers are too small for the working set, B
lends room. Chunks A evicts from its SSD land on B instead of being deleted, A's Lookup
reports them on a peer, and A serves them byte-identical (fetched over B's data plane).
When B is killed (-9), those chunks become misses on A, never other bytes. When B needs
room for its own chunks it evicts A's first and tells A (through the ledger), whose
Lookup stops offering them without a read failing on them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
import redis.asyncio as aioredis
from service_probes import free_port

from attnstore.kvstore_client import KVStoreClient, Tier
from attnstore.server.redis_process import RedisProcess

if TYPE_CHECKING:
    from conftest import ChunkSet, DaemonFactory, PollUntil

NAMESPACE = b"pool-tests-nodes"
KiB = 1024
COUNT = 36  # chunks of 68 KiB: A holds about 8 in DRAM and 14 on SSD
SMALL_TIERS = {
    "DRAM_CAPACITY_BYTES": 1024 * KiB, "DRAM_BLOCK_BYTES": 128 * KiB, "SSD_CAPACITY_BYTES": 1024 * KiB,
    "SSD_RESERVED_BYTES": 0, "MAX_CHUNK_BYTES": 512 * KiB, "EVICTION_POLICY": "lru",
    # A placement slower than this is dropped (a miss, by design); on a loaded 2-core CI
    # machine 5 s was once not enough, and these tests count every chunk as kept.
    "POOL_PEER_TIMEOUT_SECONDS": 60,
}  # fmt: skip


@pytest.fixture
def ledger(tmp_path: Path, redis_installed: None) -> Iterator[dict[str, object]]:
    """A private Redis as the pool's ledger: the daemon settings that join it."""
    redis_server = RedisProcess(tmp_path / "redis")
    redis_server.start()
    try:
        yield {"POOL_REDIS_URL": redis_server.url, "POOL_HEARTBEAT_SECONDS": 1.0}
    finally:
        redis_server.stop()


def fill_until_placed(client: KVStoreClient, chunks: ChunkSet, poll_until: PollUntil) -> list[Tier | None]:
    """Stores the COUNT chunks in a borrower (two a put, durable) until at least 10 of them
    were evicted onto its peer; where each chunk is then."""
    chunks.register(client)
    for index in range(0, COUNT, 2):
        assert len(client.put_chunks(NAMESPACE, chunks.items(index, index + 2), durable=True).stored) == 2
    return poll_until(
        lambda: (found := chunks.tiers(client, range(COUNT))).count(Tier.PEER) >= 10 and found,
        what="SSD evictions placed on the peer",
    )


def test_evicted_chunks_live_on_a_peer_and_die_with_it(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    lender = daemon_factory(DATA_PLANE_PORT=free_port())
    borrower = daemon_factory(**SMALL_TIERS, POOL_PEERS=[lender.address], POOL_CAPACITY_BYTES=64 * 1024 * KiB)
    chunks = chunk_set(NAMESPACE, num_layers=8, head_dim=64, seed=21)
    with KVStoreClient(borrower.address) as client:
        tiers = fill_until_placed(client, chunks, poll_until)
        assert None not in tiers  # nothing lost: what left A's tiers lives on B
        on_peer = [i for i, tier in enumerate(tiers) if tier is Tier.PEER]
        assert client.get_whole_chunks(NAMESPACE, chunks.keys(on_peer[0], on_peer[0] + 1)) == [
            chunks.data(on_peer[0])
        ]  # fetched from the peer, verified, byte-identical
        for index in range(COUNT):
            assert client.get_whole_chunks(NAMESPACE, [chunks.key(index)]) == [chunks.data(index)]

        peer_only = poll_until(
            lambda: [i for i, tier in enumerate(chunks.tiers(client, range(COUNT))) if tier is Tier.PEER],
            what="chunks on the peer again after the reads",
        )
        lender.kill9()
        with pytest.raises(grpc.RpcError) as failed:
            client.get_whole_chunks(NAMESPACE, [chunks.key(peer_only[0])])
        assert failed.value.code() in (grpc.StatusCode.DATA_LOSS, grpc.StatusCode.NOT_FOUND)
        assert chunks.tiers(client, [peer_only[0]]) == [None]  # a miss from now on
        for index in range(COUNT):  # the rest still reads right, or misses; never other bytes
            try:
                got = client.get_whole_chunks(NAMESPACE, [chunks.key(index)])
            except grpc.RpcError as exc:
                assert exc.code() in (grpc.StatusCode.DATA_LOSS, grpc.StatusCode.NOT_FOUND)
            else:
                assert got == [chunks.data(index)]


def test_placements_survive_the_restart_of_the_lender_and_of_the_borrower(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    """The lender keeps what it holds for others on its SSD (durable puts); the borrower
    journals where its chunks went and, killed and restarted, indexes them again."""
    lender = daemon_factory(DATA_PLANE_PORT=free_port())
    borrower = daemon_factory(**SMALL_TIERS, POOL_PEERS=[lender.address], POOL_CAPACITY_BYTES=64 * 1024 * KiB)
    chunks = chunk_set(NAMESPACE, num_layers=8, head_dim=64, seed=23)
    with KVStoreClient(borrower.address) as client:
        on_peer = [
            i for i, tier in enumerate(fill_until_placed(client, chunks, poll_until)) if tier is Tier.PEER
        ]
    lender.kill9()
    lender.restart()
    borrower.kill9()
    borrower.restart()
    with KVStoreClient(borrower.address) as client:
        assert chunks.tiers(client, on_peer) == [Tier.PEER] * len(on_peer)  # indexed again, on the same peer
        assert client.lookup(NAMESPACE, [chunks.key(on_peer[0])]).peers == [lender.address]
        for index in on_peer:
            assert client.get_whole_chunks(NAMESPACE, [chunks.key(index)]) == [chunks.data(index)]


def test_peers_come_from_the_ledger_which_forgets_a_dead_peer_and_converges_after_its_restart(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil, ledger: dict[str, object]
) -> None:
    redis_url = str(ledger["POOL_REDIS_URL"])
    lender = daemon_factory(DATA_PLANE_PORT=free_port(), **ledger)
    borrower = daemon_factory(**SMALL_TIERS, POOL_CAPACITY_BYTES=64 * 1024 * KiB, **ledger)
    chunks = chunk_set(NAMESPACE, num_layers=8, head_dim=64, seed=22)
    with KVStoreClient(borrower.address) as client:
        assert None not in fill_until_placed(client, chunks, poll_until)  # on the peer the ledger named
        for index in range(COUNT):  # a failure names the chunk and shows the borrower's log (a rare CI miss)
            try:
                got = client.get_whole_chunks(NAMESPACE, [chunks.key(index)])
            except grpc.RpcError as exc:
                raise AssertionError(f"chunk {index}: {exc.code()}\n{borrower.log_tail(120)}") from exc
            assert got == [chunks.data(index)]

    async def members() -> set[str]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return {
                key.decode().removeprefix("attnstore:pool:daemon:")
                for key in await client.keys("attnstore:pool:daemon:*")
            }
        finally:
            await client.aclose()

    assert asyncio.run(members()) == {lender.address, borrower.address}
    lender.kill9()
    poll_until(
        lambda: asyncio.run(members()) == {borrower.address}, what="the ledger forgets the killed lender"
    )
    lender.restart()  # same port and directories: it registers again
    poll_until(
        lambda: asyncio.run(members()) == {lender.address, borrower.address}, what="the ledger converges"
    )


def test_with_dram_placement_dram_evictions_go_to_a_peer_instead_of_the_local_ssd(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    lender = daemon_factory(DATA_PLANE_PORT=free_port())
    borrower = daemon_factory(
        **SMALL_TIERS, PERSIST_ON_COMMIT=False, POOL_PLACE_DRAM_EVICTIONS=True, POOL_PEERS=[lender.address],
        POOL_CAPACITY_BYTES=64 * 1024 * KiB,
    )  # fmt: skip
    chunks = chunk_set(NAMESPACE, num_layers=8, head_dim=64, seed=22)
    with KVStoreClient(borrower.address) as client:
        chunks.register(client)
        for index in range(COUNT):
            assert len(client.put_chunks(NAMESPACE, chunks.items(index, index + 1)).stored) == 1
        tiers = chunks.tiers(client, range(COUNT))
        assert set(tiers) == {Tier.DRAM, Tier.PEER}  # nothing lost, nothing written to the local SSD
        assert tiers[0] is Tier.PEER and tiers[-1] is Tier.DRAM
        assert client.stats().ssd.chunks == 0
        for index in range(COUNT):
            assert client.get_whole_chunks(NAMESPACE, [chunks.key(index)]) == [chunks.data(index)]


def test_a_lender_evicts_borrowed_chunks_before_its_own_and_tells_the_borrower(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil, ledger: dict[str, object]
) -> None:
    # 8 chunks in DRAM, 45 on SSD: room for its own 36 and some of the borrower's.
    lender = daemon_factory(
        **{**SMALL_TIERS, "SSD_CAPACITY_BYTES": 3072 * KiB},
        DATA_PLANE_PORT=free_port(),
        POOL_NODE="node-l",
        **ledger,
    )
    borrower = daemon_factory(
        **SMALL_TIERS, POOL_CAPACITY_BYTES=64 * 1024 * KiB, POOL_NODE="node-b", **ledger
    )
    borrowed = chunk_set(NAMESPACE, num_layers=8, head_dim=64, seed=24)
    own = chunk_set(b"pool-tests-own..", num_layers=8, head_dim=64, seed=25)
    with KVStoreClient(lender.address) as at_lender, KVStoreClient(borrower.address) as at_borrower:
        own.register(at_lender)

        def put_own(indices: range) -> None:
            for index in indices:
                assert (
                    len(at_lender.put_chunks(own.namespace, own.items(index, index + 1), durable=True).stored)
                    == 1
                )

        put_own(range(12))  # older than any borrowed chunk
        on_peer = [
            i for i, t in enumerate(fill_until_placed(at_borrower, borrowed, poll_until)) if t is Tier.PEER
        ]
        put_own(range(12, 36))  # its own need the room now: borrowed chunks go first

        assert None not in own.tiers(at_lender, range(36))  # an LRU alone would have evicted own 0..
        assert None in borrowed.tiers(at_lender, on_peer), (
            "the lender's own chunks fit without evicting a borrowed one"
        )

        def views_agree() -> (
            tuple[list[int]] | None
        ):  # the borrower sees what the lender holds (it may still evict)
            at_the_lender = [None if t is None else Tier.PEER for t in borrowed.tiers(at_lender, on_peer)]
            agree = at_the_lender == borrowed.tiers(at_borrower, on_peer)
            return (
                ([i for i, t in zip(on_peer, at_the_lender, strict=True) if t is Tier.PEER],)
                if agree
                else None
            )

        (kept,) = poll_until(views_agree, what="the borrower forgets what its lender evicted, with no read")
        for index in kept:
            assert at_borrower.get_whole_chunks(NAMESPACE, [borrowed.key(index)]) == [borrowed.data(index)]


def test_chunks_read_while_a_peer_refuses_them_are_served_and_never_break_the_index(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    """The SSD evicts towards a peer that never answers while a client reads the oldest
    chunks. A chunk read while its placement fails keeps its SSD copy (another one goes);
    before, the eviction dropped it from the index under the reader, whose promotion then
    landed a chunk the index no longer held: an INTERNAL error at a later DRAM eviction
    (seen once in CI). Every read gets the right bytes or a miss, never an error."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; nobody answers
        borrower = daemon_factory(
            **{**SMALL_TIERS, "POOL_PEER_TIMEOUT_SECONDS": 3}, DRAM_HIGH_WATERMARK=1.0, DRAM_LOW_WATERMARK=1.0,
            POOL_PEERS=[f"127.0.0.1:{silent.getsockname()[1]}"], POOL_CAPACITY_BYTES=64 * 1024 * KiB,
        )  # fmt: skip
        chunks = chunk_set(NAMESPACE, num_layers=8, head_dim=64, seed=24)
        with KVStoreClient(borrower.address) as client, KVStoreClient(borrower.address) as writer:
            chunks.register(client)
            for index in range(15):  # about the SSD's slots; DRAM holds chunks 7..14
                assert (
                    len(client.put_chunks(NAMESPACE, chunks.items(index, index + 1), durable=True).stored)
                    == 1
                )
            assert client.pin(NAMESPACE, chunks.keys(8, 15), ttl_seconds=120) == 7
            with ThreadPoolExecutor(1) as pool:  # their SSD writes evict the oldest towards the silent peer
                putting = pool.submit(
                    lambda: [
                        len(writer.put_chunks(NAMESPACE, chunks.items(i, i + 1), durable=True).stored)
                        for i in range(15, 20)
                    ]
                )  # one at a time: DRAM has one unpinned block (a put finding it leased stores nothing)
                poll_until(
                    lambda: client.lookup(NAMESPACE, [chunks.key(15)]).prefix_length == 1, what="chunk 15"
                )
                for index in range(4):  # read during the placements: served, a miss, or DRAM busy
                    assert read_or_miss(client, chunks, index, busy_ok=True) in (chunks.data(index), None)
                assert set(putting.result(timeout=120)) <= {0, 1}
            assert client.unpin(NAMESPACE, chunks.keys(8, 15)) == 7
            for _ in range(2):  # the second round evicts from DRAM whatever the first promoted
                assert all(
                    read_or_miss(client, chunks, index) in (chunks.data(index), None) for index in range(20)
                )


def read_or_miss(client: KVStoreClient, chunks: ChunkSet, index: int, busy_ok: bool = False) -> bytes | None:
    """The chunk's bytes, or None for a miss (NOT_FOUND: a cache may drop a chunk no peer
    takes) or, with `busy_ok`, for RESOURCE_EXHAUSTED (DRAM all pinned or leased)."""
    allowed = {grpc.StatusCode.NOT_FOUND} | ({grpc.StatusCode.RESOURCE_EXHAUSTED} if busy_ok else set())
    try:
        (data,) = client.get_whole_chunks(NAMESPACE, [chunks.key(index)])
    except grpc.RpcError as exc:
        if exc.code() not in allowed:
            raise
        return None
    return data
