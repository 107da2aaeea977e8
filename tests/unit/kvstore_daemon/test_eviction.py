"""Eviction order of each policy."""

from __future__ import annotations

import pytest

from kvstore_daemon.eviction import FifoPolicy, LookaheadPolicy, LruPolicy, make_policy
from kvstore_daemon.hints import HintAction, HintBook

NS = b"n" * 16


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _insert(policy: FifoPolicy | LruPolicy, keys: list[bytes]) -> None:
    for key in keys:
        policy.on_insert(key)


def test_fifo_ignores_access() -> None:
    policy = FifoPolicy()
    _insert(policy, [b"a", b"b", b"c"])
    policy.on_access(b"a")
    assert list(policy.victims()) == [b"a", b"b", b"c"]
    policy.on_remove(b"b")
    policy.on_remove(b"b")  # removing twice is harmless
    assert list(policy.victims()) == [b"a", b"c"]
    assert len(policy) == 2 and b"a" in policy and b"b" not in policy


def test_lru_moves_accessed_and_reinserted_keys_to_the_end() -> None:
    policy = LruPolicy()
    _insert(policy, [b"a", b"b", b"c", b"d"])
    policy.on_access(b"a")
    policy.on_insert(b"b")
    policy.on_access(b"gone")  # not resident: ignored
    assert list(policy.victims()) == [b"c", b"d", b"a", b"b"]
    assert b"gone" not in policy


def test_victims_is_a_snapshot_the_caller_may_evict_from() -> None:
    policy = LruPolicy()
    _insert(policy, [b"a", b"b", b"c"])
    evicted = []
    for key in policy.victims():
        policy.on_remove(key)  # would raise if victims() iterated the live dict
        evicted.append(key)
    assert evicted == [b"a", b"b", b"c"] and len(policy) == 0


def test_lookahead_order() -> None:
    hints, clock = HintBook(), FakeClock()
    policy = LookaheadPolicy(hints, clock)
    _insert(policy, [b"pf0", b"prot9", b"u1", b"ev", b"pr2", b"u2", b"pf9", b"u3"])
    policy.on_access(b"u1")  # LRU among unhinted: u2, u3, u1
    hints.apply(
        NS,
        [
            ([b"ev"], HintAction.EVICT_FIRST, 0),
            ([b"pf0"], HintAction.PREFETCH, 0),
            ([b"pr2"], HintAction.PROTECT, 2),
            ([b"prot9"], HintAction.PROTECT, 9),
            ([b"pf9"], HintAction.PREFETCH, 9),
        ],
        replace=False,
        ttl_seconds=10,
        now=0,
    )
    expected = [b"ev", b"u2", b"u3", b"u1", b"prot9", b"pf9", b"pr2", b"pf0"]
    assert list(policy.victims()) == expected
    # Without hints, lookahead is plain LRU.
    assert list(make_policy("lookahead", HintBook()).victims()) == []


def test_lookahead_treats_expired_hints_as_unhinted() -> None:
    hints, clock = HintBook(), FakeClock()
    policy = LookaheadPolicy(hints, clock)
    _insert(policy, [b"a", b"b", b"c"])
    hints.apply(NS, [([b"a"], HintAction.PREFETCH, 0)], replace=False, ttl_seconds=5, now=0)
    hints.apply(NS, [([b"c"], HintAction.EVICT_FIRST, 0)], replace=False, ttl_seconds=5, now=0)
    assert list(policy.victims()) == [b"c", b"b", b"a"]
    clock.now = 5.0
    assert list(policy.victims()) == [b"a", b"b", b"c"]  # back to LRU order


@pytest.mark.parametrize(
    ("name", "kind"), [("lru", LruPolicy), ("fifo", FifoPolicy), ("lookahead", LookaheadPolicy)]
)
def test_make_policy(name: str, kind: type) -> None:
    assert type(make_policy(name, HintBook())) is kind  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        make_policy("random", HintBook())  # type: ignore[arg-type]
