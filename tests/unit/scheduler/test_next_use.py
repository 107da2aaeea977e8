"""The next-use estimator (next_use.py) and the session activity that turns it into hints."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from attnstore.kvstore_client import HintAction
from attnstore_scheduler.next_use import NEVER, Population, SessionView, next_use_seconds, return_probability
from attnstore_scheduler.session_activity import ActivitySettings, SessionActivity

NS = b"n" * 16


def test_the_applications_word_comes_first() -> None:
    population = Population()
    assert next_use_seconds(SessionView(3, 0.0, expected_next_at=40.0), 10.0, population) == 30.0
    assert next_use_seconds(SessionView(3, 0.0, expected_next_at=40.0, over=True), 10.0, population) == NEVER


def test_past_its_ttl_or_predicted_beyond_it_a_session_is_never_used_again() -> None:
    population = Population()
    assert next_use_seconds(SessionView(1, 0.0, expires_at=100.0), 100.0, population) == NEVER
    assert next_use_seconds(SessionView(1, 0.0, expires_at=20.0), 10.0, population) == NEVER  # gap ~60 s
    assert next_use_seconds(SessionView(1, 0.0, expires_at=1000.0), 10.0, population) < 1000.0


def test_a_session_with_short_own_gaps_is_predicted_sooner_than_the_population() -> None:
    population = Population(prior_gap_seconds=120.0)
    quick = SessionView(5, 0.0, gaps_seconds=(5.0,) * 8)
    unknown = SessionView(5, 0.0)
    assert next_use_seconds(quick, 1.0, population) < next_use_seconds(unknown, 1.0, population)


def test_the_continuation_odds_are_learned_per_turn_count() -> None:
    population = Population()
    for _ in range(50):
        population.observe_continued(3)
        population.observe_stopped(1)
    assert population.continue_probability(3) == 0.9  # capped: idle time must keep mattering
    assert population.continue_probability(1) < 0.1
    assert next_use_seconds(SessionView(3, 0.0), 1.0, population) < next_use_seconds(
        SessionView(1, 0.0), 1.0, population
    )


@settings(max_examples=200, deadline=None)
@given(
    turns=st.integers(0, 20),
    gaps=st.lists(st.floats(0.0, 3600.0), max_size=8),
    idle=st.floats(0.0, 7200.0),
    more=st.floats(0.001, 3600.0),
)
def test_the_longer_a_session_stays_idle_the_less_likely_it_returns(
    turns: int, gaps: list[float], idle: float, more: float
) -> None:
    population = Population()
    view = SessionView(turns, 0.0, tuple(gaps))
    earlier, later = (
        return_probability(view, idle, population),
        return_probability(view, idle + more, population),
    )
    assert 0.0 <= later <= earlier <= 1.0
    seconds = next_use_seconds(view, idle, population)
    assert seconds == NEVER or (0.0 <= seconds and math.isfinite(seconds))


def _entries(activity: SessionActivity, now: float) -> dict[bytes, tuple[HintAction, float]]:
    plans = activity.predictions(now)
    return {key: (entry.action, entry.next_use_seconds) for entry in plans["node0"][NS] for key in entry.keys}


def test_activity_predicts_live_sessions_declines_ended_ones_and_forgets_them_later() -> None:
    activity = SessionActivity(ActivitySettings(decline_seconds=100.0))
    for session, chain in (("a", [b"sys", b"a1"]), ("b", [b"sys", b"b1", b"b2"])):
        activity.turn_started(session, "node0", NS, now=0.0)
        activity.turn_ended(session, chain, now=1.0)
    activity.ended("b", now=2.0)
    entries = _entries(activity, now=3.0)
    assert entries[b"a1"][0] is HintAction.PREDICT and entries[b"a1"][1] > 0
    assert entries[b"b1"] == (HintAction.DECLINE, 0.0) and entries[b"b2"] == (HintAction.DECLINE, 0.0)
    assert len(activity) == 2
    activity.predictions(now=103.0)
    assert len(activity) == 1  # b is forgotten once its chunks were declined long enough


def test_a_session_with_a_turn_under_way_is_in_use_now() -> None:
    activity = SessionActivity()
    activity.turn_started("a", "node0", NS, now=0.0)
    activity.turn_ended("a", [b"a0"], now=1.0)
    activity.turn_started("a", "node0", NS, now=61.0)  # its second turn: a 60 s gap is learned
    assert _entries(activity, now=62.0)[b"a0"] == (HintAction.PREDICT, 0.0)
    assert activity.population.gaps == 1 and activity.population.gap_sum_seconds == 60.0
