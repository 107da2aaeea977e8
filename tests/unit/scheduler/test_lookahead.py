"""Look-ahead planning: window sizes (AttentionStore's DRAM / KV-per-session and
(DRAM + SSD) / KV-per-session), the hint set of each window, shared prefixes, nodes."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from attnstore.kvstore_client import HintAction
from attnstore_scheduler.job_queue import QueuedJob
from attnstore_scheduler.lookahead import HintEntry, NodeCapacity, plan_hints

NS, NS2 = b"n" * 16, b"m" * 16
_ids = itertools.count()
EXACT = {"dram_budget_fraction": 1.0, "ssd_budget_fraction": 1.0}  # the paper's formula, no headroom


def key(session: str, index: int) -> bytes:
    return f"{session}/{index}".encode().ljust(32, b".")


def job(
    session: str,
    chunks: int,
    kv_bytes: int,
    node: str | None = "n1",
    namespace: bytes = NS,
    shared: tuple[bytes, ...] = (),
) -> QueuedJob:
    keys = shared + tuple(key(session, i) for i in range(chunks - len(shared)))
    return QueuedJob(
        job_id=f"j{next(_ids)}",
        tenant="t",
        session_id=session,
        priority=0,
        chunk_keys=keys,
        namespace=namespace,
        kv_bytes=kv_bytes,
        node=node,
        enqueued_at=0.0,
    )


@given(
    sessions=st.integers(0, 40),
    kv_bytes=st.integers(1, 1000),
    dram=st.integers(0, 10_000),
    ssd=st.integers(0, 30_000),
)
def test_uniform_sessions_get_attentionstores_window_sizes(
    sessions: int, kv_bytes: int, dram: int, ssd: int
) -> None:
    order = [job(f"s{i}", 2, kv_bytes) for i in range(sessions)]
    plan = plan_hints(order, {"n1": NodeCapacity(dram, ssd)}, **EXACT)["n1"]
    prefetch_window = min(sessions, dram // kv_bytes)
    eviction_window = min(sessions, (dram + ssd) // kv_bytes)
    assert plan.prefetch_jobs == prefetch_window
    assert plan.protect_jobs == eviction_window - prefetch_window
    assert plan.evict_first_jobs == sessions - eviction_window
    entries = plan.hints.get(NS, [])
    assert [e.queue_position for e in entries] == list(range(sessions))
    assert [e.action for e in entries] == (
        [HintAction.PREFETCH] * prefetch_window
        + [HintAction.PROTECT] * (eviction_window - prefetch_window)
        + [HintAction.EVICT_FIRST] * (sessions - eviction_window)
    )
    assert plan.hinted_keys == 2 * sessions


def test_each_window_gets_its_hints_with_queue_positions() -> None:
    order = [job("a", 2, 100), job("b", 3, 300), job("c", 1, 100), job("d", 2, 200)]
    plan = plan_hints(order, {"n1": NodeCapacity(dram_bytes=400, ssd_bytes=200)}, **EXACT)["n1"]
    assert plan.hints == {
        NS: [
            HintEntry((key("a", 0), key("a", 1)), HintAction.PREFETCH, 0),
            HintEntry((key("b", 0), key("b", 1), key("b", 2)), HintAction.PREFETCH, 1),  # 400 bytes: fits
            HintEntry((key("c", 0),), HintAction.PROTECT, 2),  # 500 > 400 DRAM, <= 600 DRAM + SSD
            HintEntry((key("d", 0), key("d", 1)), HintAction.EVICT_FIRST, 3),  # 700 > 600: needed last
        ]
    }


def test_default_budgets_leave_headroom_in_dram() -> None:
    order = [job(f"s{i}", 1, 100) for i in range(10)]
    plan = plan_hints(order, {"n1": NodeCapacity(dram_bytes=1000, ssd_bytes=1000)})["n1"]
    assert plan.prefetch_jobs == 8  # 80% of DRAM
    assert plan.prefetch_jobs + plan.protect_jobs == 10


def test_a_shared_prefix_counts_and_is_hinted_once_at_its_earliest_job() -> None:
    system = (key("system", 0), key("system", 1))
    order = [
        job("a", 4, 400, shared=system),
        job("b", 4, 400, shared=system),
        job("c", 4, 400, shared=system),
    ]
    plan = plan_hints(order, {"n1": NodeCapacity(dram_bytes=800, ssd_bytes=0)}, **EXACT)["n1"]
    # 400 + 200 + 200 bytes of distinct chunks: all three fit in 800.
    assert plan.prefetch_jobs == 3
    entries = plan.hints[NS]
    assert entries[0].keys == (*system, key("a", 0), key("a", 1))
    assert entries[1].keys == (key("b", 0), key("b", 1)) and entries[1].queue_position == 1
    assert plan.hinted_keys == 8


def test_nodes_and_namespaces_are_planned_separately() -> None:
    order = [
        job("running", 1, 10, node="n1"),
        job("x", 1, 10, node="n2"),
        job("y", 1, 10, node="n1", namespace=NS2),
        job("unrouted", 1, 10, node=None),
        job("elsewhere", 1, 10, node="unknown-node"),
        job("empty", 0, 0, node="n1"),
    ]
    capacities = {"n1": NodeCapacity(100, 100), "n2": NodeCapacity(100, 100), "idle": NodeCapacity(100, 100)}
    plans = plan_hints(order, capacities)
    assert plans["n1"].hints == {
        NS: [HintEntry((key("running", 0),), HintAction.PREFETCH, 0)],
        NS2: [HintEntry((key("y", 0),), HintAction.PREFETCH, 1)],
    }
    assert plans["n2"].hints == {NS: [HintEntry((key("x", 0),), HintAction.PREFETCH, 0)]}
    assert plans["idle"].hints == {} and plans["idle"].hinted_keys == 0  # replaced by nothing
    assert set(plans) == set(capacities)
