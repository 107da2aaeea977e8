"""The offline optimum of bench-hitrate (bench/hitrate/optimal.py) against exhaustive search
over every keep/evict/decline choice, on small random prefix trees: sessions whose chains
grow turn by turn, some sharing a first chunk (a system prompt), their turns interleaved."""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.hitrate.optimal import Chain, Key, optimal_hits


def exhaustive_hits(schedule: Sequence[Chain], capacity_chunks: int) -> int:
    """The most prefix hits over every choice of what to hold after each lookup."""

    @functools.cache
    def best(time: int, held: frozenset[Key]) -> int:
        if time == len(schedule):
            return 0
        chain = schedule[time]
        hits = 0
        for key in chain:
            if key not in held:
                break
            hits += 1
        candidates = sorted(held | set(chain), key=repr)
        return hits + max(best(time + 1, frozenset(kept)) for kept in _subsets(candidates, capacity_chunks))

    return best(0, frozenset())


def _subsets(items: list[Key], most: int) -> list[tuple[Key, ...]]:
    out: list[tuple[Key, ...]] = [()]
    for item in items:
        out += [subset + (item,) for subset in out if len(subset) < most]
    return out


def random_schedule(seed: int, sessions: int, turns: int, most_new_chunks: int = 2) -> list[Chain]:
    """Sessions of `turns` turns, each adding 1..most_new_chunks chunks to the session's chain;
    about half the sessions share their first chunk; turns of different sessions interleave."""
    rng = random.Random(seed)
    pending: list[list[Chain]] = []
    for session in range(sessions):
        chain: Chain = ("system",) if rng.random() < 0.5 else (f"s{session}",)
        turns_of_session: list[Chain] = []
        for turn in range(turns):
            chain += tuple(f"s{session}-t{turn}-{i}" for i in range(rng.randint(1, most_new_chunks)))
            turns_of_session.append(chain)
        pending.append(turns_of_session)
    schedule: list[Chain] = []
    while any(pending):
        schedule.append(rng.choice([turns for turns in pending if turns]).pop(0))
    return schedule


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    sessions=st.integers(1, 3),
    turns=st.integers(1, 3),
    most_new_chunks=st.integers(1, 2),
    capacity=st.integers(0, 4),
)
def test_min_with_chain_rules_is_the_exhaustive_optimum(
    seed: int, sessions: int, turns: int, most_new_chunks: int, capacity: int
) -> None:
    schedule = random_schedule(seed, sessions, turns, most_new_chunks)
    assert optimal_hits(schedule, capacity) == exhaustive_hits(schedule, capacity)


def test_declines_a_chunk_used_later_than_everything_held() -> None:
    schedule: list[Chain] = [("a", "b"), ("c",), ("a", "b"), ("c",), ("a",)]
    # Room for two: a and b are used again first; c is declined both times.
    assert optimal_hits(schedule, 2) == 3 == exhaustive_hits(schedule, 2)


def test_evicts_the_deepest_among_chunks_used_by_the_same_lookup() -> None:
    # With room for one, the root is the only chunk whose hit a store can serve.
    schedule: list[Chain] = [("r", "x"), ("r", "x")]
    assert optimal_hits(schedule, 1) == 1 == exhaustive_hits(schedule, 1)


@pytest.mark.parametrize("capacity", [0, 1, 3, 100])
def test_more_room_never_hits_less(capacity: int) -> None:
    schedule = random_schedule(seed=7, sessions=5, turns=5)
    assert optimal_hits(schedule, capacity) <= optimal_hits(schedule, capacity + 1)
    assert optimal_hits(schedule, 0) == 0
