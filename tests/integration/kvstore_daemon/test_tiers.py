"""DRAM and SSD tiers under pressure in a real daemon: demotion, promotion, SSD overflow,
and the victim order of each eviction policy as seen through Lookup."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import pytest

from attnstore.kvstore_client import HintAction, KVStoreClient, Tier

if TYPE_CHECKING:  # the fixtures' types; conftest modules are not imported by name
    from conftest import ChunkSet, DaemonFactory, PollUntil

KiB, MiB = 1024, 1024 * 1024
BLOCK_BYTES = 256 * KiB
# 7 layers of 128 KiB plus the 4 KiB header: 900 KiB, so each chunk takes 4 arena blocks.
SHAPE = {"num_layers": 7, "kv_heads": 4, "head_dim": 128, "chunk_tokens": 64}
CHUNK_BLOCKS = 4
SMALL_DRAM = {
    "DRAM_BLOCK_BYTES": BLOCK_BYTES,
    "MAX_CHUNK_BYTES": MiB,
    "PERSIST_ON_COMMIT": "false",  # chunks reach SSD only by demotion
}
# Evictions only on allocation (no background demotion at a fill ratio): the victim order
# is then exactly the policy's.
NO_WATERMARK = {"DRAM_HIGH_WATERMARK": 1.0, "DRAM_LOW_WATERMARK": 1.0}


def test_a_full_dram_demotes_to_ssd_and_reads_promote_back(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    # No upkeep demotion, so DRAM contents change only on allocation and Stats agrees with Lookup.
    daemon = daemon_factory(**SMALL_DRAM, **NO_WATERMARK, DRAM_CAPACITY_BYTES=8 * MiB, EVICTION_POLICY="lru")
    chunks = chunk_set(**SHAPE)
    count = 40  # 35 MiB of chunks for an 8 MiB arena (8 chunks)
    keys = chunks.keys(0, count)
    with KVStoreClient(daemon.address) as shm, KVStoreClient(daemon.address, use_shm=False) as grpc_client:
        chunks.register(shm)
        for index in range(count):
            assert shm.put_chunks(chunks.namespace, chunks.items(index, index + 1)).stored == [keys[index]]

        stats = shm.stats()
        assert stats.dram.used_bytes <= stats.dram.capacity_bytes == 8 * MiB
        assert stats.dram.chunks <= 8 and stats.dram.chunks + stats.ssd.chunks == count
        assert stats.demotions >= count - 8 and stats.dram.evictions >= count - 8
        lookup = shm.lookup(chunks.namespace, keys)
        assert lookup.prefix_length == count
        assert lookup.tiers[: count - 8] == [Tier.SSD] * (count - 8)  # the oldest left DRAM
        assert lookup.tiers.count(Tier.DRAM) == stats.dram.chunks

        for client in (shm, grpc_client):  # every chunk, through both transports
            for start in range(0, count, 4):
                batch = keys[start : start + 4]
                assert client.get_whole_chunks(chunks.namespace, batch) == [
                    chunks.data(index) for index in range(start, start + 4)
                ]
        stats = shm.stats()
        assert stats.promotions >= count - 8
        assert stats.dram.used_bytes <= stats.dram.capacity_bytes
        assert stats.dram.chunks + stats.ssd.chunks >= count
        poll_until(lambda: shm.stats().leases == 0, what="the client to release its read leases")


def test_ssd_overflow_deletes_the_oldest_chunks(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    # DRAM holds 4 chunks, SSD about 8: of 24 chunks only the newest dozen can survive.
    daemon = daemon_factory(
        **SMALL_DRAM, DRAM_CAPACITY_BYTES=4 * MiB, SSD_CAPACITY_BYTES=8 * MiB, EVICTION_POLICY="lru"
    )
    chunks = chunk_set(**SHAPE)
    count = 24
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        for index in range(count):
            client.put_chunks(chunks.namespace, chunks.items(index, index + 1))

        stats = client.stats()
        assert stats.ssd.used_bytes <= stats.ssd.capacity_bytes == 8 * MiB
        assert stats.ssd.evictions > 0
        assert stats.dram.chunks + stats.ssd.chunks <= 4 + 9
        tiers = chunks.tiers(client, range(count))
        assert tiers[:8] == [None] * 8, "the oldest chunks must be gone from every tier"
        assert client.lookup(chunks.namespace, chunks.keys(0, count)).prefix_length == 0
        present = [index for index, tier in enumerate(tiers) if tier is not None]
        assert present[-4:] == list(range(count - 4, count))
        for index in reversed(present):
            # Reading promotes, and the promotion's demotion pushes the oldest SSD chunks out:
            # the newest must read back intact, an older one intact or not at all.
            try:
                got = client.get_whole_chunks(chunks.namespace, [chunks.key(index)])
            except grpc.RpcError as exc:
                assert index < count - 4 and exc.code() == grpc.StatusCode.NOT_FOUND, exc
            else:
                assert got == [chunks.data(index)]


@pytest.mark.parametrize(
    ("policy", "evicted", "kept"),
    [("lru", 1, 0), ("fifo", 0, 1)],  # after chunk 0 is read again, the fifth put evicts one of them
)
def test_lru_and_fifo_victim_order(
    daemon_factory: DaemonFactory,
    chunk_set: type[ChunkSet],
    poll_until: PollUntil,
    policy: str,
    evicted: int,
    kept: int,
) -> None:
    daemon = daemon_factory(
        **SMALL_DRAM,
        **NO_WATERMARK,
        DRAM_CAPACITY_BYTES=4 * CHUNK_BLOCKS * BLOCK_BYTES,
        EVICTION_POLICY=policy,
    )
    chunks = chunk_set(**SHAPE)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 4))  # DRAM is now full
        assert client.get_whole_chunks(chunks.namespace, [chunks.key(0)]) == [chunks.data(0)]
        # The read is over once its lease ends (the client releases it a moment later).
        poll_until(lambda: client.stats().leases == 0, what="the read lease to end")
        client.put_chunks(chunks.namespace, chunks.items(4, 5))  # one eviction
        assert chunks.tiers(client, [evicted, kept, 2, 3, 4]) == [Tier.SSD] + [Tier.DRAM] * 4
        assert client.stats().eviction_policy == policy


def test_lookahead_evicts_hinted_chunks_first_and_prefetches_from_ssd(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    daemon = daemon_factory(
        **SMALL_DRAM,
        **NO_WATERMARK,
        DRAM_CAPACITY_BYTES=4 * CHUNK_BLOCKS * BLOCK_BYTES,
        EVICTION_POLICY="lookahead",
    )
    chunks = chunk_set(**SHAPE)
    ns = chunks.namespace
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(ns, chunks.items(0, 4))
        # Unhinted, chunks 0 and 1 (least recently used) would go first; the hint overrides it.
        assert client.hint(ns, [(chunks.keys(2, 4), HintAction.EVICT_FIRST, 0)]).hinted_keys == 2
        client.put_chunks(ns, chunks.items(4, 6))
        dram, ssd = Tier.DRAM, Tier.SSD
        assert chunks.tiers(client, range(6)) == [dram, dram, ssd, ssd, dram, dram]
        assert client.stats().demotions == 2

        # A prefetch hint loads an SSD-only chunk back into DRAM in the background.
        assert client.hint(ns, [([chunks.key(2)], HintAction.PREFETCH, 0)]).prefetches_started == 1
        poll_until(lambda: chunks.tiers(client, [2]) == [Tier.DRAM], what="chunk 2 prefetched into DRAM")
        stats = client.stats()
        assert stats.promotions == 1 and stats.dram.chunks == 4
        assert chunks.tiers(client, [3]) == [Tier.SSD]  # not hinted for prefetch: stays on SSD
        for start in (0, 3):  # and every chunk reads back intact, wherever it is
            assert client.get_whole_chunks(ns, chunks.keys(start, start + 3)) == [
                chunks.data(index) for index in range(start, start + 3)
            ]


def test_background_ssd_writes_do_not_make_dram_refuse_work(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    """With PERSIST_ON_COMMIT every fresh chunk is being written to SSD for a moment; a
    full DRAM of such chunks is neither pinned nor leased, so a put must wait for or evict
    them, never answer NO_SPACE (nor a read RESOURCE_EXHAUSTED)."""
    daemon = daemon_factory(
        **{**SMALL_DRAM, "PERSIST_ON_COMMIT": "true"},
        **NO_WATERMARK,
        DRAM_CAPACITY_BYTES=4 * CHUNK_BLOCKS * BLOCK_BYTES,
        EVICTION_POLICY="lru",
    )
    chunks = chunk_set(**SHAPE)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        for start in range(0, 16, 4):  # each put fills the whole arena
            result = client.put_chunks(chunks.namespace, chunks.items(start, start + 4))
            assert result.stored == chunks.keys(start, start + 4), f"no_space: {len(result.no_space)}"
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 4)) == [
            chunks.data(i) for i in range(4)
        ]


def test_a_chunk_whose_ssd_copy_was_evicted_is_written_again_when_dram_evicts_it(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    """FIFO on both tiers: chunk 0, read back into DRAM, is the SSD's oldest and loses its
    SSD copy while DRAM holds it. When DRAM later evicts it, it must be written to SSD
    again; before, its first (finished) write was taken for the new one and the chunk left
    the store while the demotions metric counted a demotion."""
    daemon = daemon_factory(
        **SMALL_DRAM, **NO_WATERMARK, DRAM_CAPACITY_BYTES=8 * MiB, SSD_CAPACITY_BYTES=12 * 900 * KiB,
        SSD_RESERVED_BYTES=0, EVICTION_POLICY="fifo",
    )  # fmt: skip
    chunks = chunk_set(**SHAPE)
    # gRPC reads hold no lease: a shared-memory read's lease ends on a timer, and a chunk
    # still leased when DRAM evicts it keeps its DRAM copy (a flake once, at load 11).
    with KVStoreClient(daemon.address, use_shm=False) as client:
        chunks.register(client)
        for index in range(12):  # durable: every chunk on SSD (12 slots); DRAM holds 4..11
            assert (
                len(client.put_chunks(chunks.namespace, chunks.items(index, index + 1), durable=True).stored)
                == 1
            )
        assert chunks.tiers(client, [0]) == [Tier.SSD]
        assert client.get_whole_chunks(chunks.namespace, [chunks.key(0)]) == [chunks.data(0)]  # into DRAM
        for index in range(12, 21):  # SSD writes evict chunk 0's copy first, then DRAM evicts chunk 0
            assert (
                len(client.put_chunks(chunks.namespace, chunks.items(index, index + 1), durable=True).stored)
                == 1
            )
        assert chunks.tiers(client, [0]) == [Tier.SSD]  # written again, not dropped
        assert client.get_whole_chunks(chunks.namespace, [chunks.key(0)]) == [chunks.data(0)]
