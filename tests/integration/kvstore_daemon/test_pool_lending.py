"""Lender-side accounting (issue 21): a daemon counts what it holds for each pool borrower
(ReservePut's borrower), refuses borrowed chunks past its lending limits (free room above
its floor, a ceiling on what it lends) without touching its own, and reports it (metrics,
the ledger's lent_bytes), also after a restart (the borrower is in the SSD file's name). A
borrower name that cannot label a metric is INVALID_ARGUMENT."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
import pytest
from service_probes import scrape_metrics

from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client import AsyncKVStoreClient, KVStoreClient, Tier

if TYPE_CHECKING:
    from conftest import ChunkSet, DaemonFactory, PollUntil

    from kvstore_daemon.launcher import DaemonProcess

KiB = 1024
MiB = 1024 * KiB
# The lending limits count the SSD tier alone (borrowed chunks live there only): of its
# 4 MiB the floor keeps 0.8 MiB free, at most 2 MiB may be lent (the defaults, 0.2 and 0.5);
# chunks are 68 KiB (a 128 KiB block in DRAM, and on SSD when durable).
LENDER = {
    "DRAM_CAPACITY_BYTES": 1 * MiB, "DRAM_BLOCK_BYTES": 128 * KiB, "SSD_CAPACITY_BYTES": 4 * MiB,
    "SSD_RESERVED_BYTES": 0, "MAX_CHUNK_BYTES": 512 * KiB, "EVICTION_POLICY": "lru",
}  # fmt: skip
OWN, BORROWED = 8, 60
LENT = 'attnstore_kvstore_lent_bytes{borrower="node-b"}'
NAMESPACE = b"pool-lending-ns."


@pytest.fixture
def chunks(chunk_set: type[ChunkSet]) -> ChunkSet:
    return chunk_set(NAMESPACE, num_layers=8, head_dim=64, seed=5)  # 68 KiB each


async def _borrow(address: str, chunks: ChunkSet, indices: range, read_first_after: int = -1) -> list[bytes]:
    """Places chunks `indices` as a peer's PeerTier places its evictions; the keys stored.
    The borrower reads the first of them back once `read_first_after` more are placed."""
    stored = []
    async with AsyncKVStoreClient(address) as peer:
        for index in indices:
            placed = await peer.put_chunks(chunks.namespace, chunks.items(index, index + 1), durable=True,
                                           borrower="node-b")  # fmt: skip
            stored += placed.stored
            if index == indices[0] + read_first_after:
                first = indices[0]
                assert await peer.get_whole_chunks(chunks.namespace, [chunks.key(first)]) == [
                    chunks.data(first)
                ]
    return stored


def test_a_lender_counts_what_it_holds_for_a_borrower_and_refuses_more_than_its_limits(
    daemon_factory: DaemonFactory, chunks: ChunkSet
) -> None:
    lender = daemon_factory(**LENDER, METRICS_PORT=0, POOL_REPLACE_BORROWED=False)
    port = lender.metrics_port

    with KVStoreClient(lender.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, OWN))
        lent_keys = asyncio.run(_borrow(lender.address, chunks, range(OWN, OWN + BORROWED)))

        samples = scrape_metrics(port)
        assert 0 < len(lent_keys) < BORROWED  # it lent, then the limits refused the rest
        assert samples["attnstore_kvstore_lending_refused_total"] == BORROWED - len(lent_keys)
        assert samples[LENT] == len(lent_keys) * len(chunks.data(0)) <= 2 * MiB  # the ceiling: half its SSD
        assert None not in chunks.tiers(client, range(OWN)), "an own chunk was dropped for borrowed ones"
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, OWN)) == [
            chunks.data(i) for i in range(OWN)
        ]

        client.delete(chunks.namespace, lent_keys)  # given back: nothing lent
        assert scrape_metrics(port).get(LENT, 0.0) == 0.0


def test_a_lender_at_its_limits_replaces_the_borrowed_chunks_least_recently_placed_or_read(
    daemon_factory: DaemonFactory, chunks: ChunkSet
) -> None:
    """pool_replace_borrowed (the default): past its limits a lender evicts borrowed chunks
    to take newer ones, as one LRU over the pool would, never its own; a borrowed chunk its
    borrower read goes after the ones placed since."""
    lender = daemon_factory(**LENDER, METRICS_PORT=0)
    port = lender.metrics_port
    first = OWN
    with KVStoreClient(lender.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, OWN))
        # the first borrowed chunk is read once, before the lender reaches its limits (29 chunks)
        placed = asyncio.run(
            _borrow(lender.address, chunks, range(OWN, OWN + BORROWED), read_first_after=BORROWED // 3)
        )
        assert len(placed) == BORROWED

        samples = scrape_metrics(port)
        assert samples.get("attnstore_kvstore_lending_refused_total", 0.0) == 0.0
        assert samples[LENT] <= 2 * MiB  # the ceiling holds
        where = chunks.tiers(client, range(OWN + BORROWED))
        assert None not in where[:OWN], "an own chunk was dropped for borrowed ones"
        assert where[first] is not None and where[-1] is not None  # placed first but read; the newest
        assert where[first + 1] is None  # placed early, never read: replaced
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, OWN)) == [
            chunks.data(i) for i in range(OWN)
        ]


def test_a_replacing_lender_never_replaces_pinned_borrowed_chunks_it_refuses_instead(
    daemon_factory: DaemonFactory, chunks: ChunkSet, poll_until: PollUntil
) -> None:
    """Pinned borrowed chunks (a far segment a worker attends: lent_chunks.py) stay on SSD
    and are not replaced: a lender at its ceiling with only pinned ones refuses the next;
    unpinned, they are replaced again."""
    lender = daemon_factory(
        **{**LENDER, "DRAM_CAPACITY_BYTES": 8 * MiB, "SSD_CAPACITY_BYTES": 1 * MiB},
        POOL_OWN_FLOOR_FRACTION=0.0, POOL_MAX_LENT_FRACTION=0.5,
    )  # fmt: skip
    fits = (MiB // 2) // len(chunks.data(0))  # 7 chunks of 68 KiB in 512 KiB
    with KVStoreClient(lender.address) as client:
        chunks.register(client)
        assert asyncio.run(_borrow(lender.address, chunks, range(fits))) == chunks.keys(0, fits)
        poll_until(
            lambda: chunks.tiers(client, range(fits)) == [Tier.SSD] * fits, what="the borrowed chunks on SSD"
        )
        assert client.pin(chunks.namespace, chunks.keys(0, fits), ttl_seconds=600) == fits

        assert asyncio.run(_borrow(lender.address, chunks, range(fits, fits + 1))) == []  # refused
        assert (
            chunks.tiers(client, range(fits)) == [Tier.SSD] * fits
        )  # all kept; pinned to stay, not promoted

        client.unpin(chunks.namespace, chunks.keys(0, 1))
        assert asyncio.run(_borrow(lender.address, chunks, range(fits, fits + 1))) == [chunks.key(fits)]
        assert chunks.tiers(client, range(fits))[0] is None  # the unpinned one made room
        assert None not in chunks.tiers(client, range(1, fits))


def test_a_borrowed_chunk_lives_on_the_lenders_ssd_and_leaves_its_dram_to_its_own_node(
    daemon_factory: DaemonFactory, chunks: ChunkSet, poll_until: PollUntil
) -> None:
    lender = daemon_factory(**LENDER)
    with KVStoreClient(lender.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 1))  # its own: stays in DRAM
        assert asyncio.run(_borrow(lender.address, chunks, range(1, 2))) == [chunks.key(1)]
        poll_until(
            lambda: chunks.tiers(client, range(2)) == [Tier.DRAM, Tier.SSD],
            what="the borrowed chunk left DRAM",
        )
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 2)) == [
            chunks.data(0),
            chunks.data(1),
        ]


def test_the_lending_limits_count_only_the_ssd_room_borrowed_chunks_take(
    daemon_factory: DaemonFactory, chunks: ChunkSet, poll_until: PollUntil
) -> None:
    """At the boundary: a lender with 8 MiB of DRAM free and a 1 MiB SSD, no floor, half
    lent, takes exactly the borrowed chunks that fit half its SSD, all on SSD and readable.
    Counted against DRAM + SSD (4.5 MiB lendable) it took them all, and as they all went
    to the SSD, the later ones evicted the earlier ones its borrower counted on."""
    lender = daemon_factory(
        **{**LENDER, "DRAM_CAPACITY_BYTES": 8 * MiB, "SSD_CAPACITY_BYTES": 1 * MiB},
        POOL_OWN_FLOOR_FRACTION=0.0, POOL_MAX_LENT_FRACTION=0.5, POOL_REPLACE_BORROWED=False,
    )  # fmt: skip
    fits = (MiB // 2) // len(chunks.data(0))  # 7 chunks of 68 KiB in 512 KiB
    with KVStoreClient(lender.address) as client:
        chunks.register(client)
        assert asyncio.run(_borrow(lender.address, chunks, range(fits + 2))) == chunks.keys(0, fits)
        poll_until(
            lambda: chunks.tiers(client, range(fits)) == [Tier.SSD] * fits, what="the borrowed chunks on SSD"
        )
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, fits)) == [
            chunks.data(i) for i in range(fits)
        ]


def test_one_put_is_checked_against_the_ceiling_including_its_own_chunks(
    daemon_factory: DaemonFactory, chunks: ChunkSet, poll_until: PollUntil
) -> None:
    """A put of more borrowed chunks than the ceiling leaves room for takes those that fit
    and refuses the rest: each chunk is checked counting the ones reserved before it in
    the same put (checked against what was lent before the put, all were taken)."""
    lender = daemon_factory(
        **{**LENDER, "DRAM_CAPACITY_BYTES": 8 * MiB, "SSD_CAPACITY_BYTES": 1 * MiB},
        METRICS_PORT=0, POOL_OWN_FLOOR_FRACTION=0.0, POOL_MAX_LENT_FRACTION=0.5, POOL_REPLACE_BORROWED=False,
    )  # fmt: skip
    size = len(chunks.data(0))
    fits = (MiB // 2) // size  # 7 chunks of 68 KiB in 512 KiB
    with KVStoreClient(lender.address) as client:
        chunks.register(client)
        placed = client.put_chunks(
            chunks.namespace, chunks.items(0, fits + 3), durable=True, borrower="node-b"
        )
        assert placed.stored == chunks.keys(0, fits)
        assert placed.no_space == chunks.keys(fits, fits + 3)
        assert scrape_metrics(lender.metrics_port)[LENT] == fits * size <= MiB // 2  # the ceiling holds
        poll_until(
            lambda: chunks.tiers(client, range(fits)) == [Tier.SSD] * fits, what="the borrowed chunks on SSD"
        )
        # the next put finds the ceiling reached by the first
        assert (
            client.put_chunks(chunks.namespace, chunks.items(fits + 3, fits + 4), borrower="node-b").stored
            == []
        )


def test_a_restarted_lender_still_counts_what_it_holds_for_each_borrower(
    daemon_factory: DaemonFactory, chunks: ChunkSet
) -> None:
    lender = daemon_factory(**LENDER, METRICS_PORT=0)
    port = lender.metrics_port

    async def borrow(borrower: str, index: int) -> None:
        async with AsyncKVStoreClient(lender.address) as peer:
            placed = await peer.put_chunks(chunks.namespace, chunks.items(index, index + 1), durable=True,
                                           borrower=borrower)  # fmt: skip
            assert placed.stored == [chunks.key(index)]

    with KVStoreClient(lender.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 1), durable=True)  # its own
    asyncio.run(borrow("node-b", 1))
    asyncio.run(borrow("node-ü", 2))  # any name a metric label takes
    before = scrape_metrics(port)
    lender.restart()  # its DRAM is gone: what it knows comes from the SSD files

    after = scrape_metrics(port)
    size = len(chunks.data(0))
    assert before[LENT] == after[LENT] == size
    assert after['attnstore_kvstore_lent_bytes{borrower="node-ü"}'] == size
    with KVStoreClient(lender.address) as client:
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 3)) == [
            chunks.data(i) for i in range(3)
        ]
        client.delete(chunks.namespace, chunks.keys(1, 3))
    assert scrape_metrics(port).get(LENT, 0.0) == 0.0


def test_a_chunk_larger_than_the_lending_limits_is_refused(
    daemon_factory: DaemonFactory, chunks: ChunkSet
) -> None:
    lender = daemon_factory(**LENDER, POOL_MAX_LENT_FRACTION=0.01)  # 51 KiB may be lent: less than a chunk
    with KVStoreClient(lender.address) as client:
        chunks.register(client)

        async def borrow() -> list[bytes]:
            async with AsyncKVStoreClient(lender.address) as peer:
                placed = await peer.put_chunks(
                    chunks.namespace, chunks.items(0, 1), durable=True, borrower="node-b"
                )
                return placed.no_space

        assert asyncio.run(borrow()) == [chunks.key(0)]
        assert len(client.put_chunks(chunks.namespace, chunks.items(0, 1)).stored) == 1  # its own: stored


def test_a_borrower_name_too_long_for_a_metric_label_is_invalid(
    daemon: DaemonProcess, chunks: ChunkSet, raw_stub: Callable[[DaemonProcess], kvstore_pb2_grpc.KVStoreStub]
) -> None:
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
    request = kvstore_pb2.ReservePutRequest(
        namespace=chunks.namespace, items=[kvstore_pb2.PutItem(key=chunks.key(0), size_bytes=4096)],
        borrower="n" * 129,
    )  # fmt: skip
    with pytest.raises(grpc.RpcError) as refused:
        raw_stub(daemon).ReservePut(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "borrower must be at most 128 characters, got 129" in (refused.value.details() or "")
    request.borrower = "ü" * 100  # 100 characters, 200 bytes: too long for an SSD file's name
    with pytest.raises(grpc.RpcError) as refused:
        raw_stub(daemon).ReservePut(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "borrower must be at most 128 bytes in UTF-8, got 200" in (refused.value.details() or "")
