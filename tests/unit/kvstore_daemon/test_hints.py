"""HintBook: replace, TTL expiry, and the most-urgent-hint rule."""

from __future__ import annotations

import pytest

from kvstore_daemon.hints import Hint, HintAction, HintBook

NS_A, NS_B = b"a" * 16, b"b" * 16
PREFETCH, PROTECT, EVICT_FIRST = HintAction.PREFETCH, HintAction.PROTECT, HintAction.EVICT_FIRST


def test_get_returns_the_hint_until_it_expires() -> None:
    book = HintBook()
    assert book.apply(NS_A, [([b"k1", b"k2"], PROTECT, 3)], replace=False, ttl_seconds=10, now=100) == 2
    assert book.get(b"k1", now=109.9) == Hint(PROTECT, 3, 110.0)
    assert book.get(b"k1", now=110.0) is None  # expired hints count as absent
    assert book.get(b"unknown", now=100) is None
    assert len(book) == 2  # still stored until expire()
    assert book.expire(now=110.0) == 2
    assert len(book) == 0


def test_replace_forgets_only_that_namespaces_earlier_hints() -> None:
    book = HintBook()
    book.apply(NS_A, [([b"a1", b"a2"], PREFETCH, 0)], replace=False, ttl_seconds=10, now=0)
    book.apply(NS_B, [([b"b1"], PROTECT, 1)], replace=False, ttl_seconds=10, now=0)
    assert book.apply(NS_A, [([b"a3"], EVICT_FIRST, 0)], replace=True, ttl_seconds=10, now=1) == 1
    assert book.get(b"a1", now=1) is None and book.get(b"a2", now=1) is None
    assert book.get(b"a3", now=1) == Hint(EVICT_FIRST, 0, 11.0)
    assert book.get(b"b1", now=1) == Hint(PROTECT, 1, 10.0)
    # Without replace the namespace's hints accumulate.
    assert book.apply(NS_A, [([b"a4"], PROTECT, 2)], replace=False, ttl_seconds=10, now=1) == 2


def test_most_urgent_hint_wins() -> None:
    book = HintBook()
    book.apply(
        NS_A,
        [
            ([b"x", b"y", b"z"], EVICT_FIRST, 0),
            ([b"x"], PROTECT, 7),  # any keep-hint beats EVICT_FIRST
            ([b"x"], PROTECT, 9),  # a later queue position loses
            ([b"y"], PROTECT, 2),
            ([b"y"], PREFETCH, 2),  # at the same position PREFETCH beats PROTECT
            ([b"y"], PROTECT, 2),
        ],
        replace=False,
        ttl_seconds=10,
        now=0,
    )
    assert book.get(b"x", now=0) == Hint(PROTECT, 7, 10.0)
    assert book.get(b"y", now=0) == Hint(PREFETCH, 2, 10.0)
    assert book.get(b"z", now=0) == Hint(EVICT_FIRST, 0, 10.0, depth=2, parent=b"y")  # its chain: x, y, z
    # A later, less urgent hint does not override a live one...
    book.apply(NS_A, [([b"x"], EVICT_FIRST, 0)], replace=False, ttl_seconds=10, now=5)
    assert book.get(b"x", now=5) == Hint(PROTECT, 7, 10.0)
    # ...but an equally urgent one refreshes the expiry, and any hint replaces an expired one.
    book.apply(NS_A, [([b"x"], PROTECT, 7)], replace=False, ttl_seconds=10, now=5)
    assert book.get(b"x", now=5) == Hint(PROTECT, 7, 15.0)
    book.apply(NS_A, [([b"y"], EVICT_FIRST, 3)], replace=False, ttl_seconds=10, now=20)
    assert book.get(b"y", now=20) == Hint(EVICT_FIRST, 3, 30.0)


def test_prefetch_keys_are_live_prefetches_by_queue_position() -> None:
    book = HintBook()
    book.apply(
        NS_A,
        [([b"p5"], PREFETCH, 5), ([b"p1", b"p1b"], PREFETCH, 1), ([b"keep"], PROTECT, 0)],
        replace=False,
        ttl_seconds=10,
        now=0,
    )
    book.apply(NS_B, [([b"p0"], PREFETCH, 0)], replace=False, ttl_seconds=1, now=0)
    assert book.prefetch_keys(now=0.5) == [b"p0", b"p1", b"p1b", b"p5"]
    assert book.prefetch_keys(now=1.0) == [b"p1", b"p1b", b"p5"]  # p0 expired


def test_forget_drops_keys_and_frees_the_namespace() -> None:
    book = HintBook()
    book.apply(NS_A, [([b"k1", b"k2"], PREFETCH, 0)], replace=False, ttl_seconds=10, now=0)
    book.forget([b"k1", b"never-hinted"])
    assert book.get(b"k1", now=0) is None
    assert len(book) == 1
    book.forget([b"k2"])
    assert len(book) == 0
    # A replace after everything was forgotten still works and counts from zero.
    assert book.apply(NS_A, [([b"k3"], PROTECT, 0)], replace=True, ttl_seconds=10, now=0) == 1


def test_rejects_bad_ttl_and_position() -> None:
    book = HintBook()
    with pytest.raises(ValueError):
        book.apply(NS_A, [([b"k"], PROTECT, 0)], replace=False, ttl_seconds=0, now=0)
    with pytest.raises(ValueError):
        book.apply(NS_A, [([b"k"], PROTECT, -1)], replace=False, ttl_seconds=1, now=0)


def test_generation_changes_with_the_stored_hints() -> None:
    book = HintBook()
    start = book.generation
    book.apply(NS_A, [([b"k"], PROTECT, 0)], replace=False, ttl_seconds=10, now=0)
    after_apply = book.generation
    book.forget([b"unknown"])
    assert after_apply != start and book.generation == after_apply  # forgetting nothing changes nothing
    book.forget([b"k"])
    assert book.generation != after_apply


def test_expire_is_free_until_the_earliest_hint_is_due() -> None:
    book = HintBook()
    book.apply(NS_A, [([b"short"], PROTECT, 0)], replace=False, ttl_seconds=5, now=0)
    book.apply(NS_A, [([b"long"], PROTECT, 0)], replace=False, ttl_seconds=50, now=0)
    generation = book.generation
    assert book.expire(now=4.9) == 0 and book.generation == generation
    assert book.expire(now=5.0) == 1 and book.generation != generation
    assert book.get(b"long", now=5.0) is not None
    # A refreshed hint moves its expiry: nothing is dropped when the old one would have been due.
    book.apply(NS_A, [([b"long"], PROTECT, 0)], replace=False, ttl_seconds=100, now=40)
    assert book.expire(now=60) == 0 and book.get(b"long", now=60) is not None
    assert book.expire(now=140) == 1 and len(book) == 0


def test_evict_first_keys_are_the_live_evict_first_hints() -> None:
    book = HintBook()
    book.apply(NS_A, [([b"e1", b"e2", b"x"], EVICT_FIRST, 0)], replace=False, ttl_seconds=10, now=0)
    book.apply(NS_A, [([b"x"], PROTECT, 1)], replace=False, ttl_seconds=10, now=0)  # more urgent: wins
    book.apply(NS_B, [([b"e3"], EVICT_FIRST, 0)], replace=False, ttl_seconds=1, now=0)
    assert sorted(book.evict_first_keys(now=0)) == [b"e1", b"e2", b"e3"]
    assert sorted(book.evict_first_keys(now=1)) == [b"e1", b"e2"]  # e3 expired
    book.forget([b"e1"])
    book.apply(NS_A, [([b"e2"], PREFETCH, 0)], replace=False, ttl_seconds=10, now=1)
    assert book.evict_first_keys(now=1) == []


def test_only_a_replace_of_predictions_starts_a_generation_and_many_additions_count_as_one() -> None:
    book = HintBook()
    keys = [bytes([i]) * 8 for i in range(64)]
    book.apply(NS_A, [(keys, HintAction.PREDICT, 0, 30.0)], replace=True, ttl_seconds=10, now=0)
    assert book.prediction_generation == 1 and book.repredicted == []
    book.apply(NS_A, [(keys[:2], HintAction.PREDICT, 0, 1.0)], replace=False, ttl_seconds=10, now=1)
    assert book.prediction_generation == 1 and book.repredicted == keys[:2]  # re-ranked alone
    assert book.last_prediction_at == 0  # an addition passes over no other key
    book.apply(NS_A, [(keys[2:40], HintAction.PREDICT, 0, 5.0)], replace=False, ttl_seconds=10, now=2)
    assert book.prediction_generation == 2 and book.repredicted == []  # more than 1/8 of them: a new sort
