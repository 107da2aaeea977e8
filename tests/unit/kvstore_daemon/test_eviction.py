"""Eviction order of each policy."""

from __future__ import annotations

import pytest
from fake_clock import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore_daemon.eviction import (
    EvictionPolicy,
    FifoPolicy,
    LookaheadPolicy,
    LruPolicy,
    PolicyName,
    make_policy,
)
from kvstore_daemon.hints import HintAction, HintBook

NS = b"n" * 16


def _insert(policy: EvictionPolicy, keys: list[bytes]) -> None:
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


@pytest.mark.parametrize("name", ["lru", "fifo", "lookahead"])
def test_victims_is_lazy_and_a_tier_evicts_one_victim_at_a_time(name: PolicyName) -> None:
    policy = make_policy(name, HintBook())
    _insert(policy, [b"a", b"b", b"c"])
    evicted = []
    while len(policy):
        victim = next(policy.victims())  # take one, stop walking, evict it, ask again
        policy.on_remove(victim)
        evicted.append(victim)
    assert evicted == [b"a", b"b", b"c"]


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


def test_lookahead_puts_keys_back_in_lru_place_when_their_hints_go() -> None:
    hints, clock = HintBook(), FakeClock()
    policy = LookaheadPolicy(hints, clock)
    _insert(policy, [b"a", b"b", b"c", b"d"])
    hints.apply(NS, [([b"a", b"b"], HintAction.PROTECT, 1)], replace=False, ttl_seconds=10, now=0)
    assert list(policy.victims()) == [b"c", b"d", b"a", b"b"]  # a and b leave the LRU walk
    hints.forget([b"a"])
    assert list(policy.victims()) == [b"a", b"c", b"d", b"b"]
    hints.forget([b"b"])  # b goes back behind a (used before it), ahead of c and d
    assert list(policy.victims()) == [b"a", b"b", b"c", b"d"]
    hints.apply(NS, [([b"c"], HintAction.PREFETCH, 0)], replace=False, ttl_seconds=10, now=0)
    assert list(policy.victims()) == [b"a", b"b", b"d", b"c"]
    policy.on_access(b"c")  # a read makes a key the most recently used, hinted or not
    clock.now = 10.0  # the hint expires: c is plain LRU again
    assert list(policy.victims()) == [b"a", b"b", b"d", b"c"]
    policy.on_remove(b"c")
    assert b"c" not in policy and len(policy) == 3


@pytest.mark.parametrize(
    ("name", "kind"), [("lru", LruPolicy), ("fifo", FifoPolicy), ("lookahead", LookaheadPolicy)]
)
def test_make_policy(name: str, kind: type) -> None:
    assert type(make_policy(name, HintBook())) is kind  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        make_policy("random", HintBook())  # type: ignore[arg-type]


class ReferenceLookahead:
    """The lookahead order computed from scratch on every call (a full sort of every
    resident key): what LookaheadPolicy's parked, lazy walk must always agree with."""

    def __init__(self, hints: HintBook, clock: FakeClock) -> None:
        self.hints, self.clock, self.order = hints, clock, LruPolicy()

    def victims(self) -> list[bytes]:
        now = self.clock()
        evict_first, unhinted, needed = [], [], []
        for key in self.order.victims():
            hint = self.hints.get(key, now)
            if hint is None:
                unhinted.append(key)
            elif hint.action.gives_up:
                evict_first.append(key)
            else:
                needed.append((-hint.queue_position, hint.action is HintAction.PREFETCH, key))
        needed.sort(key=lambda item: item[:2])
        return evict_first + unhinted + [key for _, _, key in needed]


_KEYS = st.sampled_from([bytes([k]) for k in range(8)])
_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["insert", "access", "remove"]), _KEYS),
        st.tuples(
            st.just("hint"),
            st.lists(_KEYS, max_size=4),
            st.sampled_from(list(HintAction)),
            st.integers(0, 3),
            st.booleans(),
            st.integers(1, 3),
        ),
        st.tuples(st.just("forget"), st.lists(_KEYS, max_size=3)),
        st.tuples(st.just("time"), st.integers(1, 2)),
        st.tuples(st.sampled_from(["walk", "evict"])),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(st.permutations([bytes([k]) for k in range(8)]), _OPERATIONS)
def test_lookahead_always_agrees_with_the_full_sort(resident: list[bytes], operations: list[tuple]) -> None:
    hints, clock = HintBook(), FakeClock()
    policy, reference = LookaheadPolicy(hints, clock), ReferenceLookahead(hints, clock)
    _insert(policy, resident)
    _insert(reference.order, resident)
    for operation in operations:
        kind = operation[0]
        if kind in ("insert", "access", "remove"):
            for target in (policy, reference.order):
                getattr(target, f"on_{kind}")(operation[1])
        elif kind == "hint":
            _, keys, action, position, replace, ttl = operation
            hints.apply(NS, [(keys, action, position)], replace=replace, ttl_seconds=ttl, now=clock.now)
        elif kind == "forget":
            hints.forget(operation[1])
        elif kind == "time":
            clock.now += operation[1]
        elif kind == "walk":
            assert list(policy.victims()) == reference.victims()
        elif len(policy):  # evict: the tier takes the first victim only
            victim = next(policy.victims())
            assert victim == reference.victims()[0]
            policy.on_remove(victim)
            reference.order.on_remove(victim)
        assert len(policy) == len(reference.order)
    assert list(policy.victims()) == reference.victims()
