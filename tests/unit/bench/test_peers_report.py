"""The peers benchmark's arithmetic: ratios to LMCache, later-turn medians, verdicts."""

from __future__ import annotations

from typing import Any

from bench.daemon.report import GRPC, SHM, SHM_LEASED
from bench.peers.report import (
    ATTNSTORE,
    FITS,
    LMCACHE,
    OVER,
    VLLM,
    add_lmcache_ratios,
    format_serving_table,
    idle_waits_after,
    serving_medians,
    serving_summary,
    store_summary,
    verdicts,
)


def _row(path: str, op: str, gbps: float, size: str = "5.9MB", concurrency: int = 1) -> dict[str, Any]:
    return {
        "path": path,
        "op": op,
        "size": size,
        "concurrency": concurrency,
        "gbps": gbps,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
    }


def _turn(side: str, phase: str, turn: int, ttft_ms: float, dialogue: str = "a") -> dict[str, Any]:
    return {
        "side": side,
        "phase": phase,
        "dialogue": dialogue,
        "turn": turn,
        "ttft_ms": ttft_ms,
        "prompt_tokens": 100 * turn,
        "reused_tokens": 64 * (turn - 1) if side == ATTNSTORE else 0,
    }


def test_ratios_are_ours_over_lmcache_at_the_same_op_size_and_concurrency() -> None:
    rows = [
        _row(LMCACHE, "get", 2.0),
        _row(GRPC, "get", 1.0),
        _row(SHM, "get", 5.0),
        _row(LMCACHE, "put", 1.0),
        _row(GRPC, "put", 0.5),
        _row(SHM, "put", 2.0),
        _row(LMCACHE, "get", 4.0, concurrency=4),
        _row(SHM, "get", 6.0, concurrency=4),
        _row(GRPC, "get", 9.0, size="0.5MB"),  # no LMCache row at 0.5MB: no ratio
        _row(SHM_LEASED, "get", 1.0),
    ]
    add_lmcache_ratios(rows)
    assert [r["vs_lmcache"] for r in rows] == [None, 0.5, 2.5, None, 0.5, 2.0, None, 1.5, None, 0.5]
    summary = store_summary(rows)
    assert summary["daemon_vs_lmcache_throughput"] == 0.5
    assert summary["daemon_vs_lmcache_throughput_put"] == 0.5
    assert summary["daemon_shm_vs_lmcache_throughput"] == 2.5
    assert summary["daemon_shm_vs_lmcache_throughput_c4"] == 1.5
    assert summary["daemon_vs_lmcache_throughput_c4"] is None  # no gRPC row at c=4
    assert summary["daemon_shm_leased_vs_lmcache_throughput"] == 0.5


def test_later_turns_are_turn_three_on_and_the_ratio_is_ours_over_vllms() -> None:
    records = [
        _turn(VLLM, OVER, 1, 100.0),
        _turn(VLLM, OVER, 3, 1000.0),
        _turn(VLLM, OVER, 4, 3000.0),
        _turn(ATTNSTORE, OVER, 1, 200.0),
        _turn(ATTNSTORE, OVER, 3, 400.0),
        _turn(ATTNSTORE, OVER, 4, 600.0),
        _turn(VLLM, FITS, 3, 100.0),
        _turn(ATTNSTORE, FITS, 3, 150.0),
    ]
    summary = serving_summary(records)
    assert summary["later_turn_median_ttft_ms"] == {ATTNSTORE: 500.0, VLLM: 2000.0}
    assert summary["later_turn_ttft_vs_vllm"] == 0.25
    assert summary["later_turn_ttft_vs_vllm_fits"] == 1.5
    assert summary["first_turn_ttft_vs_vllm"] == 2.0  # turn 1 of both phases: 200 ms / 100 ms


def test_medians_group_by_phase_side_and_turn() -> None:
    records = [
        _turn(VLLM, OVER, 2, 10.0, "a"),
        _turn(VLLM, OVER, 2, 30.0, "b"),
        _turn(ATTNSTORE, OVER, 2, 5.0),
    ]
    medians = serving_medians(records)
    assert medians[(OVER, VLLM, 2)] == {
        "ttft_ms": 20.0,
        "prompt_tokens": 200,
        "reused_tokens": None,
        "turns": 2,
    }
    assert medians[(OVER, ATTNSTORE, 2)]["reused_tokens"] == 64
    table = format_serving_table(records)
    assert "over capacity" in table and "0.25" in table  # 5 ms / 20 ms


def test_verdicts_pass_fail_and_unavailable() -> None:
    passed, lines = verdicts(
        {
            "daemon_vs_lmcache_throughput": 1.2,
            "daemon_vs_lmcache_throughput_put": 0.8,
            "later_turn_ttft_vs_vllm": 0.4,
        }
    )
    assert passed["daemon_vs_lmcache_throughput"] is True
    assert passed["daemon_vs_lmcache_throughput_put"] is False
    assert passed["later_turn_ttft_vs_vllm"] is True
    assert passed["daemon_shm_vs_lmcache_throughput"] is None
    assert sum(line.startswith("UNAVAILABLE") for line in lines) == 2


def test_idle_waits_are_grouped_by_the_side_that_ran_just_before() -> None:
    records = [
        _turn(VLLM, OVER, 1, 1.0),
        _turn(ATTNSTORE, OVER, 1, 1.0),
        _turn(ATTNSTORE, OVER, 2, 1.0),
        _turn(VLLM, OVER, 2, 1.0),
    ]
    for record, waited in zip(records, (100.0, 1000.0, 120.0, 140.0)):
        record["idle_wait_ms"] = waited
    assert idle_waits_after(records) == {VLLM: 1000.0, ATTNSTORE: 130.0}  # the first wait follows nothing
