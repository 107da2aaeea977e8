"""What the predictive order learns from the keys a lookup names beyond its stored prefix
(ChunkLives.missed): an evicted key named again was needed, at a known age."""

from __future__ import annotations

import pytest

from kvstore_daemon.chunk_lives import ChunkLives
from kvstore_daemon.eviction import LruPolicy
from kvstore_daemon.hints import HintBook
from kvstore_daemon.hit_density import _MIDS, age_bin
from kvstore_daemon.predictive_policy import PredictivePolicy


def _evicted_then_named(lives: ChunkLives, key: bytes, ticks_between: int) -> int:
    """Stores `key`, evicts it, lets `ticks_between` other lives start, then a lookup names
    it beyond its prefix; returns the class it was evicted in."""
    cls = lives.copied(key).cls
    lives.dropped(key)
    for i in range(ticks_between):
        lives.copied(f"other{i}".encode())
    lives.missed([key])
    return cls


def test_a_miss_on_an_evicted_key_is_learned_as_a_read_at_its_age() -> None:
    lives = ChunkLives(lambda: 0.0)
    cls = _evicted_then_named(lives, b"k", ticks_between=100)
    # One read at age 101 (its own life's tick too), no unread end: P = 1, wait = the bin's middle.
    assert lives.learner.density(cls, 0) == pytest.approx(1 / _MIDS[age_bin(101)])
    lives.missed([b"k"])  # named again: the ghost is spent, nothing more is learned
    assert lives.learner.density(cls, 0) == pytest.approx(1 / _MIDS[age_bin(101)])


def test_without_the_miss_the_eviction_stays_an_unread_end() -> None:
    lives = ChunkLives(lambda: 0.0)
    cls = lives.copied(b"k").cls
    lives.dropped(b"k")
    lives.missed([b"never stored"])
    assert lives.learner.density(cls, 0) == 0


def test_ghosts_are_capped_earliest_evicted_first() -> None:
    lives = ChunkLives(lambda: 0.0, ghost_keys_max=1)
    cls = lives.copied(b"first").cls
    lives.copied(b"second")
    lives.dropped(b"first")
    lives.dropped(b"second")  # the cap forgets "first"
    lives.missed([b"first"])
    assert lives.learner.density(cls, 0) == 0
    lives.missed([b"second"])
    assert lives.learner.density(cls, 0) > 0


def _returning_keys(
    policy: PredictivePolicy | LruPolicy,
    now: list[float],
    keys: int = 2000,
    gap_s: float = 40.0,
    capacity: int = 10,
) -> tuple[int, int]:
    """A new key each second; every other one is looked up again `gap_s` later. A lookup
    that misses tells the policy, and the key is stored (again). The store turns over in
    `capacity` seconds, so LRU hits nothing; a policy that knows nothing of which keys
    return can keep at most capacity / gap_s of them until they do (a quarter, half of
    which return): 250 hits of 1,000 returns. Returns (hits, returns)."""
    events = sorted(
        [(float(t), f"k{t}".encode()) for t in range(keys)]
        + [(t + gap_s + 0.5, f"k{t}".encode()) for t in range(0, keys, 2)]
    )
    hits = 0
    for now[0], key in events:
        if key in policy:
            policy.on_access(key)
            hits += 1
            continue
        if isinstance(policy, PredictivePolicy):
            policy.on_miss([key])
        if len(policy) >= capacity:
            policy.on_remove(next(iter(policy.victims())))
        policy.on_insert(key)
    return hits, keys // 2


def _predictive(ghost_keys_max: int) -> tuple[PredictivePolicy, list[float]]:
    now = [0.0]
    return PredictivePolicy(
        HintBook(), lambda: now[0], ChunkLives(lambda: now[0], ghost_keys_max=ghost_keys_max)
    ), now


def test_learning_from_misses_keeps_what_lru_loses() -> None:
    now = [0.0]
    assert _returning_keys(LruPolicy(), now)[0] == 0
    hits, returns = _returning_keys(*_predictive(ghost_keys_max=1 << 17))
    assert hits > 0.05 * returns  # 94 of 1,000 here: older keys are nearer their return
    assert _returning_keys(*_predictive(ghost_keys_max=0))[0] == 0  # nothing learned: nothing kept
