"""The predictive policy in a real daemon: it evicts the chunk predicted to be used
furthest ahead first, hints of two scheduler replicas (sources) coexist, and admission
declines the chunks of a session the scheduler says nobody will read again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from service_probes import scrape_metrics

from attnstore.kvstore_client import HintAction, KVStoreClient, Tier
from kvstore_daemon.tier_mover import SKIP_LOG_INTERVAL_SECONDS

if TYPE_CHECKING:  # the fixtures' types; conftest modules are not imported by name
    from conftest import ChunkSet, DaemonFactory, PollUntil

KiB = 1024
BLOCK_BYTES = 256 * KiB
SHAPE = {"num_layers": 7, "kv_heads": 4, "head_dim": 128, "chunk_tokens": 64}  # 900 KiB: 4 blocks
PREDICTIVE_DRAM_OF_4_CHUNKS = {
    "DRAM_BLOCK_BYTES": BLOCK_BYTES,
    "MAX_CHUNK_BYTES": 1024 * KiB,
    "PERSIST_ON_COMMIT": "false",
    "DRAM_HIGH_WATERMARK": 1.0,
    "DRAM_LOW_WATERMARK": 1.0,  # evictions only on allocation: the policy's order
    "DRAM_CAPACITY_BYTES": 4 * 4 * BLOCK_BYTES,
    "EVICTION_POLICY": "predictive",
    "PREDICTIVE_PREFETCH_DRAM_SHARE": 0.5,  # the predicted prefetch on (off by default)
}
PREDICT, DECLINE = HintAction.PREDICT, HintAction.DECLINE
DRAM, SSD = Tier.DRAM, Tier.SSD
SKIPPED_BY_PREFETCH = 'attnstore_kvstore_promotions_skipped_total{reason="prefetch_no_victim"}'


Store = tuple[KVStoreClient, "ChunkSet"]


@pytest.fixture
def store(daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]) -> Iterator[Store]:
    """A client of a predictive daemon whose DRAM holds four chunks, and a registered chunk set."""
    daemon = daemon_factory(**PREDICTIVE_DRAM_OF_4_CHUNKS)
    chunks = chunk_set(**SHAPE)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        yield client, chunks


def _put_five_chunk_3_on_ssd(client: KVStoreClient, chunks: ChunkSet) -> None:
    """Chunks 0-4 into a DRAM of four, chunk i predicted in 100 (i + 1) s: chunk 3 goes to SSD."""
    ns = chunks.namespace
    client.put_chunks(ns, chunks.items(0, 4))
    client.hint(ns, [([chunks.key(i)], PREDICT, 0, 100.0 * (i + 1)) for i in range(4)], replace=True)
    client.put_chunks(ns, chunks.items(4, 5))  # chunk 3, predicted last, goes to SSD
    assert chunks.tiers(client, [3]) == [SSD]


def test_evicts_the_furthest_predicted_chunk_and_keeps_both_replicas_hints(store: Store) -> None:
    client, chunks = store
    ns = chunks.namespace
    client.put_chunks(ns, chunks.items(0, 4))
    client.hint(
        ns,
        [([chunks.key(0)], PREDICT, 0, 300.0), ([chunks.key(1)], PREDICT, 0, 10.0)],
        replace=True,
        source="replica-a",
    )
    client.hint(
        ns,
        [([chunks.key(2)], PREDICT, 0, 20.0), ([chunks.key(3)], PREDICT, 0, 30.0)],
        replace=True,
        source="replica-b",
    )
    client.put_chunks(ns, chunks.items(4, 5))  # LRU would evict chunk 0 too: check it is the prediction
    assert chunks.tiers(client, range(5)) == [SSD, DRAM, DRAM, DRAM, DRAM]

    # Replica a pushes its window again; replica b's predictions must survive it.
    client.hint(
        ns,
        [([chunks.key(1)], PREDICT, 0, 10.0), ([chunks.key(4)], PREDICT, 0, 5.0)],
        replace=True,
        source="replica-a",
    )
    client.put_chunks(ns, chunks.items(5, 6))
    # Had a's replace wiped b's hints, chunk 2 (unhinted, least recently used) would go.
    assert chunks.tiers(client, range(1, 6)) == [DRAM, DRAM, SSD, DRAM, DRAM]
    assert client.stats().eviction_policy == "predictive"


def test_admission_declines_a_deleted_sessions_chunks_and_evicts_them_first(store: Store) -> None:
    client, chunks = store
    ns = chunks.namespace
    client.put_chunks(ns, chunks.items(0, 3))
    # The session owning chunks 1, 5 and 6 was deleted; the live one (0, 2) comes back soon.
    client.hint(
        ns,
        [
            (chunks.keys(0, 1) + chunks.keys(2, 3), PREDICT, 0, 5.0),
            ([chunks.key(1), chunks.key(5), chunks.key(6)], DECLINE, 0),
        ],
        replace=True,
    )
    put = client.put_chunks(ns, chunks.items(5, 7))
    assert sorted(put.no_space) == sorted(chunks.keys(5, 7)) and not put.stored
    assert client.stats().admissions_declined == 2
    client.put_chunks(ns, chunks.items(3, 5))  # the fourth chunk fits; the fifth evicts the declined one
    assert chunks.tiers(client, range(5)) == [DRAM, SSD, DRAM, DRAM, DRAM]
    assert client.lookup(ns, chunks.keys(5, 7)).prefix_length == 0


def test_the_soonest_predicted_chunk_moves_up_to_dram_in_place_of_a_later_one(
    store: Store, poll_until: PollUntil
) -> None:
    client, chunks = store
    ns = chunks.namespace
    _put_five_chunk_3_on_ssd(client, chunks)
    # Now chunk 3 is expected in a second: it comes back to DRAM, in place of chunk 2 (300 s).
    client.hint(
        ns,
        [([chunks.key(3)], PREDICT, 0, 1.0), ([chunks.key(4)], PREDICT, 0, 50.0)]
        + [([chunks.key(i)], PREDICT, 0, 100.0 * (i + 1)) for i in range(3)],
        replace=True,
    )
    poll_until(lambda: chunks.tiers(client, [3]) == [DRAM], what="chunk 3 promoted ahead of its use")
    assert chunks.tiers(client, range(5)) == [DRAM, DRAM, SSD, DRAM, DRAM]


def test_a_moved_up_chunk_drops_its_ssd_copy_and_is_written_back_when_dram_evicts_it_surviving_a_crash(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    daemon = daemon_factory(**PREDICTIVE_DRAM_OF_4_CHUNKS)
    chunks = chunk_set(**SHAPE)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        ns = chunks.namespace
        _put_five_chunk_3_on_ssd(client, chunks)
        client.hint(
            ns,
            [([chunks.key(3)], PREDICT, 0, 1.0), ([chunks.key(4)], PREDICT, 0, 50.0)]
            + [([chunks.key(i)], PREDICT, 0, 100.0 * (i + 1)) for i in range(3)],
            replace=True,
        )
        poll_until(lambda: chunks.tiers(client, [3]) == [DRAM], what="chunk 3 promoted ahead of its use")
        # A move: only chunk 2, which DRAM demoted for it, is on SSD (persist_on_commit is off).
        poll_until(lambda: client.stats().ssd.chunks == 1, what="chunk 3's SSD copy dropped")
        # Now chunk 3 is expected last: the next write takes its DRAM room, and it goes back to SSD.
        client.hint(
            ns,
            [([chunks.key(3)], PREDICT, 0, 900.0)]
            + [([chunks.key(i)], PREDICT, 0, 100.0 * (i + 1)) for i in (0, 1, 2, 4)],
            replace=True,
        )
        client.put_chunks(ns, chunks.items(5, 6))
        poll_until(lambda: chunks.tiers(client, [3]) == [SSD], what="chunk 3 written back to SSD")
        assert client.get_whole_chunks(ns, [chunks.key(3)]) == [chunks.data(3)]
    daemon.kill9()
    daemon.start()
    with KVStoreClient(daemon.address) as client:
        assert client.get_whole_chunks(ns, [chunks.key(3)]) == [chunks.data(3)]  # from its SSD file


def test_a_queued_prefetch_moves_its_chunk_keeping_no_ssd_copy(store: Store, poll_until: PollUntil) -> None:
    client, chunks = store
    ns = chunks.namespace
    _put_five_chunk_3_on_ssd(client, chunks)
    assert client.stats().ssd.chunks == 1
    # A queued job needs chunk 3: it comes up to DRAM in place of one of the others.
    client.hint(ns, [([chunks.key(3)], HintAction.PREFETCH, 0)], replace=True, source="queue")
    poll_until(lambda: chunks.tiers(client, [3]) == [DRAM], what="chunk 3 prefetched for its job")
    # A move, as the predicted prefetch's: only the chunk DRAM demoted for it is on SSD, so
    # the store holds five chunks, not four and a copy.
    poll_until(lambda: client.stats().ssd.chunks == 1, what="chunk 3's SSD copy dropped")
    assert chunks.tiers(client, range(5)).count(SSD) == 1
    assert client.get_whole_chunks(ns, [chunks.key(3)]) == [chunks.data(3)]


def test_ssd_only_admission_stores_a_declined_chunk_on_ssd_first_to_go(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    daemon = daemon_factory(**PREDICTIVE_DRAM_OF_4_CHUNKS, DECLINED_ADMISSION="ssd_only")
    chunks = chunk_set(**SHAPE)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        ns = chunks.namespace
        client.hint(ns, [([chunks.key(0)], DECLINE, 0)], replace=True)
        put = client.put_chunks(ns, chunks.items(0, 2))
        assert sorted(put.stored) == sorted(chunks.keys(0, 2)) and not put.no_space
        assert client.stats().admissions_declined == 1
        # The declined chunk leaves DRAM at once: DRAM keeps its room for what will be read.
        poll_until(lambda: chunks.tiers(client, [0]) == [SSD], what="the declined chunk demoted to SSD")
        assert chunks.tiers(client, [1]) == [DRAM]


def test_a_prefetch_that_may_evict_nothing_is_counted_by_its_cause_and_logged_once(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], poll_until: PollUntil
) -> None:
    """Every DRAM chunk is queued (PROTECT): the predicted chunk on SSD may take none's room.
    The skip names the prefetch's filter, not pinned or leased chunks, and repeated skips
    are counted but logged once per interval (they flooded 10-minute replays' logs)."""
    daemon = daemon_factory(**PREDICTIVE_DRAM_OF_4_CHUNKS, METRICS_PORT=0)
    port = daemon.metrics_port
    chunks = chunk_set(**SHAPE)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        ns = chunks.namespace
        _put_five_chunk_3_on_ssd(client, chunks)
        started = time.monotonic()
        for push in range(3):  # each push is a new prediction generation: a new try
            client.hint(
                ns,
                [([chunks.key(3)], PREDICT, 0, 1.0 + push)]
                + [([chunks.key(i)], HintAction.PROTECT, i) for i in (0, 1, 2, 4)],
                replace=True,
            )
            poll_until(
                lambda p=push: scrape_metrics(port).get(SKIPPED_BY_PREFETCH, 0) >= p + 1,
                what=f"prefetch {push} skipped",
            )
        seconds = time.monotonic() - started
        assert chunks.tiers(client, range(5)) == [DRAM, DRAM, DRAM, SSD, DRAM]
    samples = scrape_metrics(port)
    assert samples.get('attnstore_kvstore_promotions_skipped_total{reason="no_evictable_chunk"}', 0) == 0
    lines = [line for line in daemon.log_path.read_text().splitlines() if "promotions_skipped" in line]
    # At most one line per interval begun: three skips within one interval make one line.
    assert 1 <= len(lines) <= 1 + int(seconds // SKIP_LOG_INTERVAL_SECONDS)
    assert all("may make way for this prefetch" in line and "pinned or leased" not in line for line in lines)


def test_the_shadow_caches_count_the_stores_reads(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    """Every key sampled: the five stored chunks enter both shadows, and a lookup that
    reads them hits five times in each."""
    daemon = daemon_factory(**PREDICTIVE_DRAM_OF_4_CHUNKS, METRICS_PORT=0, PREDICTIVE_SHADOW_SHARE=1.0)
    port = daemon.metrics_port
    chunks = chunk_set(**SHAPE)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 4))
        client.put_chunks(chunks.namespace, chunks.items(4, 5))  # one of them goes to SSD
        before = scrape_metrics(port)
        assert client.lookup(chunks.namespace, chunks.keys(0, 7)).prefix_length == 5
    samples = scrape_metrics(port)
    for order in ("predictive", "lru"):
        name = f'attnstore_kvstore_shadow_hits_total{{order="{order}"}}'
        assert (before[name], samples[name]) == (0, 5)
    assert samples["attnstore_kvstore_predictive_order_followed"] == 1
    # Ten sampled requests (five births, five reads), all on the predictive order; no switch.
    assert samples['attnstore_kvstore_predictive_order_requests_total{order="predictive"}'] == 10
    assert samples['attnstore_kvstore_predictive_order_switches_total{order="lru"}'] == 0


def test_a_lookup_naming_a_deleted_chunk_is_learned_as_needed_again(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    """The keys a lookup names beyond its stored prefix reach the predictive policy: a
    chunk it still remembers after its deletion counts as needed again, once."""
    daemon = daemon_factory(**PREDICTIVE_DRAM_OF_4_CHUNKS, METRICS_PORT=0)
    port = daemon.metrics_port
    chunks = chunk_set(**SHAPE)
    name = 'attnstore_kvstore_evicted_needed_again_total{heard="lookup"}'
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        ns = chunks.namespace
        client.put_chunks(ns, chunks.items(0, 3))
        client.delete(ns, chunks.keys(2, 3))
        assert scrape_metrics(port).get(name, 0) == 0
        assert (
            client.lookup(ns, chunks.keys(0, 4)).prefix_length == 2
        )  # names 2 (remembered) and 3 (never stored)
        assert scrape_metrics(port)[name] == 1
        client.lookup(ns, chunks.keys(0, 4))  # its ghost is spent: learned once
        assert scrape_metrics(port)[name] == 1
