"""bench-pool's pooled replay workload: turns in the clock's order, the history a turn can
find, the LRU working set it sizes the nodes by, and the skewed deal of sessions (NODE_WEIGHTS)."""

from __future__ import annotations

import math

import pytest

from bench.hitrate.workloads import Workload, load_sharegpt
from bench.pool.pooled_workload import (
    ARRIVAL,
    COMPLETION,
    NODE_WEIGHTS,
    POOL_MARGIN,
    WORKING_SET_HIT_SHARE,
    deal,
    events,
    lru_hit_share,
    size_nodes,
    wanted_keys,
)


@pytest.fixture(scope="module")
def workload() -> Workload:
    return load_sharegpt(conversations=60, sessions_per_s=20.0, think_s=60.0, seed=3)


def test_turns_arrive_in_order_after_their_predecessor_completed(workload: Workload) -> None:
    schedule = events(workload)
    assert [event[0] for event in schedule] == sorted(event[0] for event in schedule)
    seen: dict[tuple[int, int, int], int] = {}  # (session, turn, kind) -> place in the schedule
    for position, (_, kind, number, index) in enumerate(schedule):
        seen[(number, index, kind)] = position
    for number, session in enumerate(workload.sessions):
        for index in range(len(session.turns)):
            assert seen[(number, index, ARRIVAL)] < seen[(number, index, COMPLETION)]
            if index:
                assert seen[(number, index - 1, COMPLETION)] < seen[(number, index, ARRIVAL)]


def test_a_turn_wants_only_history_its_session_stored(workload: Workload) -> None:
    for number, session in enumerate(workload.sessions):
        assert wanted_keys(workload, number, 0) == ()
        for index in range(1, len(session.turns)):
            wanted = wanted_keys(workload, number, index)
            assert wanted == session.turns[index - 1].keys[: len(wanted)]


def test_the_working_set_is_the_smallest_lru_capacity_near_a_store_that_never_evicts(
    workload: Workload,
) -> None:
    schedule = events(workload)
    every_chunk = len({key for s in workload.sessions for t in s.turns for key in t.keys})
    assert lru_hit_share(workload, schedule, every_chunk) == 1.0
    shares = [
        lru_hit_share(workload, schedule, capacity) for capacity in (1, every_chunk // 8, every_chunk // 2)
    ]
    assert shares == sorted(shares) and shares[0] < WORKING_SET_HIT_SHARE
    sizing = size_nodes(workload, schedule)
    assert lru_hit_share(workload, schedule, sizing.working_set_chunks) >= WORKING_SET_HIT_SHARE
    assert lru_hit_share(workload, schedule, sizing.working_set_chunks - 1) < WORKING_SET_HIT_SHARE
    assert sizing.node_chunks == math.ceil(sizing.working_set_chunks * POOL_MARGIN / len(NODE_WEIGHTS))


def test_sessions_are_dealt_by_the_weights_and_the_seed(workload: Workload) -> None:
    nodes = deal(workload, seed=0)
    assert nodes == deal(workload, seed=0) and len(nodes) == len(workload.sessions)
    counts = [nodes.count(node) for node in range(len(NODE_WEIGHTS))]
    assert counts[0] > counts[1] and counts[0] > counts[2]  # the busy node
