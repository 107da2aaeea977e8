"""bench-vllm's summary arithmetic (bench/vllm/run.py): the later-turn TTFT ratio with the
connector over without, per phase, tokens per second and the connector's hit tokens."""

from __future__ import annotations

from typing import Any

from bench.vllm import run


def _turn(side: str, phase: str, turn: int, ttft_ms: float) -> dict[str, Any]:
    return {
        "side": side,
        "phase": phase,
        "dialogue": "a",
        "turn": turn,
        "ttft_ms": ttft_ms,
        "total_ms": 1000.0,
        "prompt_tokens": 90,
        "completion_tokens": 10,
    }


def test_later_turns_only_and_the_ratio_is_with_over_without() -> None:
    records = [
        _turn(run.ALONE, run.OVER, 1, 100.0),
        _turn(run.WITH, run.OVER, 1, 5000.0),  # first turns: ignored
        _turn(run.ALONE, run.OVER, 3, 4000.0),
        _turn(run.WITH, run.OVER, 3, 1000.0),
        _turn(run.ALONE, run.OVER, 4, 2000.0),
        _turn(run.WITH, run.OVER, 4, 1000.0),
        _turn(run.ALONE, run.FITS, 3, 1000.0),
        _turn(run.WITH, run.FITS, 3, 1050.0),
    ]
    deltas = {
        run.FITS: {run.ALONE: {}, run.WITH: {"vllm:external_prefix_cache_hits": 0.0}},
        run.OVER: {
            run.ALONE: {"vllm:prefix_cache_hits": 64.0},
            run.WITH: {"vllm:external_prefix_cache_hits": 512.0},
        },
    }
    summary = run.summarize(records, deltas)
    assert summary["later_turn_ttft_with_connector_vs_without"] == round(1000.0 / 3000.0, 3)  # medians
    assert summary["later_turn_ttft_with_connector_vs_without_fits"] == 1.05
    assert summary["connector_hit_tokens"] == {run.FITS: 0.0, run.OVER: 512.0}
    assert summary["vllm_own_hit_tokens"][run.OVER] == {run.ALONE: 64.0, run.WITH: 0.0}
    assert summary["tokens_per_second"][run.OVER][run.ALONE] == 100.0  # 3 turns of 100 tokens in 3 s


def test_a_phase_without_later_turns_has_no_ratio() -> None:
    records = [
        _turn(run.ALONE, run.OVER, 1, 100.0),
        _turn(run.WITH, run.OVER, 1, 100.0),
        _turn(run.ALONE, run.FITS, 1, 100.0),
        _turn(run.WITH, run.FITS, 1, 100.0),
    ]
    deltas = {phase: {run.ALONE: {}, run.WITH: {}} for phase in (run.FITS, run.OVER)}
    assert run.summarize(records, deltas)["later_turn_ttft_with_connector_vs_without"] is None
