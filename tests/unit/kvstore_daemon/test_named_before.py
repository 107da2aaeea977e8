"""The class "named before" in what the predictive order learns (ChunkLives.named): a
chunk's class counts the lookups that named its key, misses and earlier lives included,
so a chunk stored after lookups asked for it is told from one no lookup ever named."""

from __future__ import annotations

import pytest

from kvstore_daemon.chunk_lives import NAMED_KEYS_MAX, ChunkLives
from kvstore_daemon.hints import HintBook
from kvstore_daemon.hit_density import MIN_CLASS_ENDS
from kvstore_daemon.predictive_policy import PredictivePolicy


def _trained(named_keys_max: int, rounds: int = 2 * MIN_CLASS_ENDS) -> PredictivePolicy:
    """A store of 4 where keys a lookup named before their store are read again 2 ticks
    later and keys no lookup named never are: what the learner is shown (each class past
    the ends it needs to speak for itself)."""
    policy = PredictivePolicy(HintBook(), lambda: 0.0, ChunkLives(lambda: 0.0, named_keys_max=named_keys_max))
    for i in range(rounds):
        named, unnamed = f"named{i}".encode(), f"unnamed{i}".encode()
        policy.on_miss([named])  # a lookup asked for it first: it was computed, then stored
        for key in (named, unnamed):
            while len(policy) >= 4:
                policy.on_remove(next(iter(policy.victims())))
            policy.on_insert(key)
        if i:
            policy.on_chain([f"named{i - 1}".encode()])  # read again
            policy.on_access(f"named{i - 1}".encode())
    return policy


@pytest.mark.parametrize(("named_keys_max", "first_out"), [(NAMED_KEYS_MAX, b"unasked"), (0, b"asked")])
def test_a_named_before_chunk_outlives_a_never_named_one_of_the_same_age(
    named_keys_max: int, first_out: bytes
) -> None:
    policy = _trained(named_keys_max)
    policy.on_miss([b"asked"])
    policy.on_insert(b"unasked")
    policy.on_insert(b"asked")  # a tick later: in one class, the later touched goes first
    order = [key for key in _evictions(policy) if key in (b"asked", b"unasked")]
    assert order[0] == first_out


def test_the_class_counts_lookups_across_lives_misses_included() -> None:
    lives = ChunkLives(lambda: 0.0)
    assert lives.copied(b"never").cls == lives.copied(b"other").cls
    lives.named([b"k"])
    lives.missed([b"k"])
    once = lives.copied(b"k").cls
    lives.named([b"k"])  # a lookup hit it: a read, and a naming the next life starts from
    lives.read(b"k")
    read = lives.lives[b"k"].cls
    lives.dropped(b"k")
    assert lives.copied(b"k").cls == read != once != lives.lives[b"never"].cls


def test_remembered_keys_are_bounded_least_recently_named_forgotten() -> None:
    lives = ChunkLives(lambda: 0.0, named_keys_max=2)
    lives.named([b"a", b"b"])
    lives.named([b"a"])  # b is now the least recently named
    lives.named([b"c"])
    assert len(lives._named) == 2
    assert lives.copied(b"b").cls == lives.copied(b"never").cls  # forgotten
    assert lives.copied(b"a").cls != lives.copied(b"c").cls  # twice vs once


def _evictions(policy: PredictivePolicy) -> list[bytes]:
    order = []
    while len(policy):
        key = next(iter(policy.victims()))
        policy.on_remove(key)
        order.append(key)
    return order
