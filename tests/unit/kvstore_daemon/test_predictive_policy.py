"""The predictive policy's order (learned hit density, steered by the scheduler's hints)
and the hint book's sources and DECLINE hints it relies on."""

from __future__ import annotations

import itertools

from fake_clock import FakeClock
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvstore_daemon.chunk_lives import REUSE_CLASSES, ChunkLives
from kvstore_daemon.eviction import make_policy
from kvstore_daemon.hints import HintAction, HintBook, HintSpec
from kvstore_daemon.hit_density import HitDensity
from kvstore_daemon.predictive_policy import PredictivePolicy

NS = b"n" * 16
PREDICT, PROTECT, DECLINE = HintAction.PREDICT, HintAction.PROTECT, HintAction.DECLINE


def _policy(keys: list[bytes]) -> tuple[PredictivePolicy, HintBook, FakeClock]:
    hints, clock = HintBook(), FakeClock()
    policy = make_policy("predictive", hints, clock)
    assert isinstance(policy, PredictivePolicy)
    for index, key in enumerate(keys):
        clock.now = index / 100
        policy.on_insert(key)
    clock.now = 1.0
    return policy, hints, clock


def _evictions(policy: PredictivePolicy) -> list[bytes]:
    """The order in which the tier would evict everything, one victim at a time."""
    order = []
    while len(policy):
        key = next(policy.victims())
        policy.on_remove(key)
        order.append(key)
    return order


def test_a_cold_learner_evicts_the_furthest_predicted_use_first_and_a_chain_from_its_tail() -> None:
    policy, hints, _ = _policy([b"r", b"s1", b"s2", b"t1", b"q"])
    hints.apply(
        NS,
        [
            HintSpec([b"r", b"s1", b"s2"], PREDICT, 0, 300.0),  # one chain: s2 is deepest
            HintSpec([b"t1"], PREDICT, 0, 30.0),
            HintSpec([b"q"], PROTECT, 4),  # a queued job's key outlasts every prediction
        ],
        replace=True,
        ttl_seconds=60,
        now=1.0,
    )
    assert _evictions(policy) == [b"s2", b"s1", b"r", b"t1", b"q"]


def test_declined_and_stale_unhinted_keys_go_first_fresh_ones_last() -> None:
    policy, hints, clock = _policy([b"old", b"gone", b"kept"])
    hints.apply(
        NS,
        [HintSpec([b"gone"], DECLINE, 0), HintSpec([b"kept"], PREDICT, 0, 10.0)],
        replace=True,
        ttl_seconds=60,
        now=1.0,
    )
    clock.now = 2.0
    policy.on_insert(b"new")  # written after the last hints: the scheduler has not seen it yet
    assert list(policy.victims()) == [b"gone", b"old", b"kept", b"new"]
    assert hints.declines(b"gone", now=2.0) and not hints.declines(b"kept", now=2.0)


def test_a_parent_read_with_its_child_is_evicted_only_after_the_child() -> None:
    policy, _, clock = _policy([b"root", b"child", b"other"])
    for clock.now, key in enumerate(
        [b"other", b"root", b"child"]
    ):  # each read once, the root before the child
        policy.on_access(key)
    policy.on_chain([b"root", b"child"])  # a lookup's stored prefix, root first
    assert _evictions(policy) == [
        b"other",
        b"child",
        b"root",
    ]  # least recently read first, but a root outlives its child


def test_a_key_whose_eviction_began_is_skipped_and_frees_its_parent_unless_it_stays() -> None:
    hints, clock = HintBook(), FakeClock()
    policy = PredictivePolicy(hints, clock, lowest_tier=False)  # DRAM: only children in DRAM hold a parent
    for clock.now, key in enumerate([b"other", b"root", b"child"]):
        policy.on_insert(key)
        policy.on_access(key)
    policy.on_chain([b"root", b"child"])
    assert list(policy.victims()) == [b"other", b"child", b"root"]
    policy.set_aside(b"child")  # its SSD copy is being written: walks must not offer it again
    assert list(policy.victims()) == [b"other", b"root"]
    policy.kept(b"child")  # read meanwhile, so it stayed in DRAM: a candidate again, before its parent
    assert list(policy.victims()) == [b"other", b"child", b"root"]
    policy.set_aside(b"child")
    policy.on_remove(b"child")  # it left: the eviction's end (kept) changes nothing
    policy.kept(b"child")
    assert list(policy.victims()) == [b"other", b"root"] and len(policy) == 2


def _learned(reused_class: int, unread_class: int, age: int) -> HitDensity:
    """A learner that saw chunks of `reused_class` read again at `age` ticks and those of
    `unread_class` never (each as often)."""
    learner = HitDensity(classes=REUSE_CLASSES)
    for _ in range(300):
        learner.hit(reused_class, age)
        learner.evicted(unread_class)
    return learner


def test_keeps_the_class_that_was_read_again_over_a_fresher_one_that_was_not() -> None:
    reread_once, never_read = 1, 0  # read once before / never
    hints, clock = HintBook(), FakeClock()
    policy = PredictivePolicy(hints, clock, ChunkLives(clock, _learned(reread_once, never_read, age=6)))
    policy.on_insert(b"old")
    policy.on_access(b"old")  # read once: its class comes back, 6 ticks later
    policy.on_insert(b"new")  # never read: its class never came back
    assert _evictions(policy) == [b"new", b"old"]


def test_a_key_nearing_the_age_its_class_is_read_at_outlasts_fresh_and_stale_ones() -> None:
    hints, clock = HintBook(), FakeClock()
    policy = PredictivePolicy(hints, clock, ChunkLives(clock, _learned(0, 0, age=40)))
    named = [b"stale", b"due", b"fresh"]
    for tick in range(61):  # stale at tick 0, due at tick 30, fresh last: ages 60, 30 and 0
        clock.now = float(tick)
        policy.on_insert(
            named[0]
            if tick == 0
            else named[1]
            if tick == 30
            else named[2]
            if tick == 60
            else tick.to_bytes(2, "big")
        )
    order = [key for key in _evictions(policy) if key in named]
    assert order == [b"stale", b"fresh", b"due"]  # LRU's would be stale, due, fresh


def test_an_evicted_key_stored_again_counts_as_a_read_at_that_age() -> None:
    learner, clock = HitDensity(classes=REUSE_CLASSES), FakeClock()
    policy = PredictivePolicy(HintBook(), clock, ChunkLives(clock, learner))
    policy.on_insert(b"k")
    for index in range(40):
        policy.on_insert(bytes([index]))
    policy.on_remove(b"k")  # evicted unread at age 40: its class never read, so far
    assert learner.density(0, 0) == 0.0
    policy.on_insert(b"k")  # stored again: it was needed 41 ticks after its last touch
    assert learner.density(0, 0) > 0.0
    assert learner.density(0, 30) > learner.density(0, 0)  # at 30 ticks idle the read is closer


def test_a_replace_forgets_only_its_own_sources_hints() -> None:
    hints = HintBook()
    hints.apply(
        NS, [HintSpec([b"a"], PREDICT, 0, 5.0)], replace=True, ttl_seconds=60, now=0, source="replica-1"
    )
    hints.apply(
        NS, [HintSpec([b"b"], PREDICT, 0, 5.0)], replace=True, ttl_seconds=60, now=0, source="replica-2"
    )
    hints.apply(NS, [], replace=True, ttl_seconds=60, now=1, source="replica-1")
    assert hints.get(b"a", now=1) is None
    assert hints.get(b"b", now=1) is not None  # replica-2's session stays protected


def test_a_key_follows_its_most_urgent_source_and_falls_back_when_that_one_goes() -> None:
    hints = HintBook()
    hints.apply(NS, [HintSpec([b"k"], DECLINE, 0)], replace=True, ttl_seconds=60, now=0, source="one")
    hints.apply(NS, [HintSpec([b"k"], PREDICT, 0, 9.0)], replace=True, ttl_seconds=10, now=0, source="two")
    assert not hints.declines(b"k", now=1)  # another replica's session still needs it
    hints.expire(now=10)
    assert hints.declines(b"k", now=10)


_KEYS = st.sampled_from([bytes([i]) for i in range(8)])
_CHAINS = st.lists(_KEYS, min_size=2, max_size=4, unique=True).map(sorted)  # parent < child: no cycles


@settings(max_examples=150, deadline=None)
@given(
    resident=st.lists(_KEYS, unique=True, min_size=1),
    reads=st.lists(_KEYS, max_size=6),
    chains=st.lists(_CHAINS, max_size=3),
    entries=st.lists(
        st.tuples(
            st.lists(_KEYS, min_size=1, max_size=1),
            st.sampled_from([PREDICT, PROTECT, DECLINE]),
            st.integers(0, 3),
            st.sampled_from([0.0, 5.0, 50.0]),
        )
    ),
)
# Found by this test: parked ancestors of a queued key came out in set order, a root before its child.
@example(
    resident=[b"\x01", b"\x02", b"\x06"],
    reads=[],
    chains=[[b"\x01", b"\x02", b"\x06"]],
    entries=[([b"\x06"], PROTECT, 0, 0.0)],
)
def test_evictions_put_given_up_keys_first_queued_last_and_children_before_parents(
    resident: list[bytes], reads: list[bytes], chains: list[list[bytes]], entries: list
) -> None:
    policy, hints, clock = _policy(resident)
    for key in reads:
        policy.on_access(key)
    for keys in chains:
        policy.on_chain(keys)
    hints.apply(NS, [HintSpec(*entry) for entry in entries], replace=True, ttl_seconds=60, now=clock.now)
    hint = {key: hints.get(key, clock.now) for key in resident}
    parent = {child: up for keys in chains for up, child in itertools.pairwise(keys) if child in resident}
    order = _evictions(policy)
    assert sorted(order) == sorted(resident)
    gives_up = {key: (h := hint[key]) is not None and h.action.gives_up for key in order}
    queued = {key: (h := hint[key]) is not None and h.action is PROTECT for key in order}
    assert [gives_up[key] for key in order] == sorted(gives_up.values(), reverse=True)  # given-up keys first
    assert [queued[key] for key in order] == sorted(queued.values())  # queued keys last
    for child, up in parent.items():  # the last chain naming a child sets its parent
        if up in resident and not gives_up[up] and not queued[child]:
            assert order.index(child) < order.index(up), (child, up)


def test_an_added_prediction_reranks_its_keys_without_a_new_generation() -> None:
    policy, hints, _ = _policy([b"a", b"b", b"c"])
    hints.apply(
        NS,
        [
            HintSpec([b"a"], PREDICT, 0, 300.0),
            HintSpec([b"b"], PREDICT, 0, 30.0),
            HintSpec([b"c"], PREDICT, 0, 100.0),
        ],
        replace=True,
        ttl_seconds=60,
        now=1.0,
    )
    assert next(policy.victims()) == b"a"
    generation = hints.prediction_generation
    # The scheduler's next push adds only the session that changed: a is needed soon now.
    hints.apply(NS, [HintSpec([b"a"], PREDICT, 0, 10.0)], replace=False, ttl_seconds=60, now=1.0)
    assert hints.prediction_generation == generation and hints.repredicted == [b"a"]
    assert _evictions(policy) == [b"c", b"b", b"a"]
