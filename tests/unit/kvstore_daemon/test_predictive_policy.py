"""The predictive policy's order (MIN on the scheduler's predictions) and the hint book's
sources and DECLINE hints it relies on."""

from __future__ import annotations

from fake_clock import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore_daemon.eviction import make_policy
from kvstore_daemon.hints import HintAction, HintBook, HintSpec
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


def test_evicts_the_furthest_predicted_use_first_and_the_deepest_among_equals() -> None:
    policy, hints, _ = _policy([b"r", b"s1", b"s2", b"t1", b"q"])
    hints.apply(NS, [
        HintSpec([b"r", b"s1", b"s2"], PREDICT, 0, 300.0),  # one chain: s2 is deepest
        HintSpec([b"t1"], PREDICT, 0, 30.0),
        HintSpec([b"q"], PROTECT, 4),  # a queued job's key outlasts every prediction
    ], replace=True, ttl_seconds=60, now=1.0)
    assert list(policy.victims()) == [b"s2", b"s1", b"r", b"t1", b"q"]


def test_declined_and_stale_unhinted_keys_go_first_fresh_ones_last() -> None:
    policy, hints, clock = _policy([b"old", b"gone", b"kept"])
    hints.apply(NS, [HintSpec([b"gone"], DECLINE, 0), HintSpec([b"kept"], PREDICT, 0, 10.0)],
                replace=True, ttl_seconds=60, now=1.0)
    clock.now = 2.0
    policy.on_insert(b"new")  # written after the last hints: the scheduler has not seen it yet
    assert list(policy.victims()) == [b"gone", b"old", b"kept", b"new"]
    assert hints.declines(b"gone", now=2.0) and not hints.declines(b"kept", now=2.0)


def test_a_replace_forgets_only_its_own_sources_hints() -> None:
    hints = HintBook()
    hints.apply(NS, [HintSpec([b"a"], PREDICT, 0, 5.0)], replace=True, ttl_seconds=60, now=0, source="replica-1")
    hints.apply(NS, [HintSpec([b"b"], PREDICT, 0, 5.0)], replace=True, ttl_seconds=60, now=0, source="replica-2")
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


_KEYS = st.sampled_from([bytes([i]) for i in range(6)])


@settings(max_examples=150, deadline=None)
@given(
    resident=st.lists(_KEYS, unique=True, min_size=1),
    entries=st.lists(st.tuples(st.lists(_KEYS, min_size=1, max_size=3, unique=True),
                               st.sampled_from([PREDICT, PROTECT, DECLINE]), st.integers(0, 3),
                               st.sampled_from([0.0, 5.0, 50.0]))),
    removed=st.lists(_KEYS, max_size=2),
)
def test_victims_agree_with_a_full_sort(resident: list[bytes], entries: list, removed: list[bytes]) -> None:
    policy, hints, _ = _policy(resident)
    hints.apply(NS, [HintSpec(*entry) for entry in entries], replace=True, ttl_seconds=60, now=1.0)
    list(policy.victims())  # ranks once; removals below must not need a re-rank
    for key in removed:
        policy.on_remove(key)
    live = [key for key in resident if key not in removed]
    hint = {k: hints.get(k, 1.0) for k in live}
    give_up = [k for k in live if (h := hint[k]) is not None and h.action.gives_up]
    unhinted = [k for k in live if hint[k] is None]

    def ranked(action: HintAction) -> list[bytes]:
        chosen = [k for k in live if (h := hint[k]) is not None and not h.action.gives_up and (h.action is PREDICT)
                  == (action is PREDICT)]
        return sorted(chosen, key=lambda k: hint[k].rank(), reverse=True)  # type: ignore[union-attr]

    # Touched before the predictions: stale, evicted before predicted keys; else after them.
    stale = hints.last_prediction_at > 0.5
    expected = give_up + (unhinted + ranked(PREDICT) if stale else ranked(PREDICT) + unhinted) + ranked(PROTECT)
    assert list(policy.victims()) == expected
