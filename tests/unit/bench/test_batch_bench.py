"""bench-batch's pure parts: percentiles and a level's throughput (stats.py), and the
memory measurements on the engine's real BlockPool and Scheduler (memory.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.batch.memory import (
    Request,
    kv_waste_fraction,
    parallel_sampling_blocks,
    parallel_sampling_saving,
    replay_waste,
    sessions_that_fit,
)
from bench.batch.report import met, verdicts
from bench.batch.run import parse_args, summarize
from bench.batch.serving import ServingConfig, batch_stack, mean_batch
from bench.batch.stats import TurnRecord, percentile_ms, ratio, summarize_level


def test_percentiles_interpolate_in_milliseconds_and_empty_is_none() -> None:
    assert percentile_ms([0.010, 0.020, 0.030], 50) == 20.0
    assert percentile_ms([0.0, 1.0], 99) == 990.0
    assert percentile_ms([], 50) is None


def test_a_level_counts_output_tokens_over_its_wall_time_and_gaps_between_tokens() -> None:
    records = [
        TurnRecord(0, 1, started=10.0, ended=11.0, token_times=[10.2, 10.3, 10.5], output_tokens=3),
        TurnRecord(1, 1, started=10.5, ended=12.0, token_times=[11.0], output_tokens=1),
        TurnRecord(1, 2, started=12.0, ended=12.0, output_tokens=0),  # an empty answer: TTFT is its end
    ]
    level = summarize_level(records)
    assert level["wall_s"] == 2.0
    assert level["output_tokens_per_s"] == 2.0
    assert level["turns_per_s"] == 1.5
    assert level["ttft_p50_ms"] == pytest.approx(200.0)  # TTFTs 0.2, 0.5, 0.0
    assert level["itl_p50_ms"] == pytest.approx(150.0)  # gaps 0.1 and 0.2: only within a turn
    with pytest.raises(ValueError):
        summarize_level([])


def test_ratio_is_none_without_a_denominator() -> None:
    assert ratio(6.0, 2.0) == 3.0
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None


def test_waste_counts_the_empty_slots_of_each_last_block_and_a_shared_block_once() -> None:
    assert kv_waste_fraction(4, [([0, 1], 8)]) == 0.0
    assert kv_waste_fraction(4, [([0, 1], 5)]) == 3 / 8
    # both hold block 0 full; each its own half-empty block 1 / 2
    assert kv_waste_fraction(4, [([0, 1], 6), ([0, 2], 6)]) == pytest.approx(4 / 12)
    assert kv_waste_fraction(4, []) == 0.0


def test_a_replay_samples_waste_every_step_below_one_partial_block_per_sequence() -> None:
    requests = [Request(list(range(100 * i, 100 * i + 30 + i)), list(range(5))) for i in range(6)]
    samples = replay_waste(requests, concurrency=3, block_tokens=8, num_blocks=64, max_batch_tokens=16)
    assert samples and all(0.0 <= s < 8 / 30 for s in samples)
    with pytest.raises(RuntimeError):  # a pool too small for one prompt never runs a step
        replay_waste(requests, concurrency=1, block_tokens=8, num_blocks=2, max_batch_tokens=16)


def test_a_shared_system_prompt_fits_more_sessions_into_the_same_pool() -> None:
    system = list(range(64))  # 8 blocks of 8
    sessions = [system + [1000 + 100 * i + t for t in range(16)] for i in range(20)]  # +2 blocks each
    assert sessions_that_fit(sessions, 40, 8, share=False) == 4  # 10 blocks each
    assert sessions_that_fit(sessions, 40, 8, share=True) == 16  # 8 + 2 x 16 = 40
    with pytest.raises(ValueError):
        sessions_that_fit(sessions[:2], 40, 8, share=True)


def test_forked_samples_share_the_prompt_and_copy_only_where_they_diverge() -> None:
    used, copies = parallel_sampling_blocks(list(range(20)), list(range(12)), n=3, block_tokens=8)
    # prompt: 2 full blocks shared + a partial block copied by each sample; 32 tokens = 4 blocks each
    assert copies == 12
    assert used == 2 + 3 * 2
    assert parallel_sampling_saving([Request(list(range(20)), list(range(12)))], 3, 8) == pytest.approx(
        1 - 8 / 12, abs=1e-4
    )


def test_the_summary_reads_the_targets_at_16_sessions() -> None:
    cells = {
        "attnstore": {16: {"output_tokens_per_s": 400.0, "ttft_p50_ms": 100.0}},
        "attnstore batch-1": {16: {"output_tokens_per_s": 50.0, "ttft_p50_ms": 900.0}},
    }
    memory = {
        "kv_waste_fraction": 0.01,
        "shared_prefix_capacity_gain": 2.5,
        "parallel_sampling": {"x": {"saved_fraction": {2: 0.1}}},
    }
    summary = summarize(cells, memory)
    assert summary["throughput_vs_batch1_at_16"] == 8.0
    assert summary["throughput_vs_vllm_at_16"] is None
    assert summary["targets_met"] == {
        "throughput_vs_batch1_at_16": True,
        "throughput_vs_vllm_at_16": None,
        "kv_waste_fraction": True,
        "shared_prefix_capacity_gain": True,
    }
    lines = verdicts(summary)
    assert lines[0].startswith("PASS") and lines[1].startswith("UNAVAILABLE")
    assert all(line.startswith("PASS") for line in lines[2:])


def test_the_mean_batch_is_sequences_over_forward_passes_between_two_reads() -> None:
    assert mean_batch((10.0, 10.0), (74.0, 14.0)) == 16.0
    assert mean_batch((10.0, 10.0), (10.0, 10.0)) is None  # no forward pass ran (vLLM's side)


def test_a_target_is_missed_on_the_wrong_side_of_its_bound() -> None:
    assert met("kv_waste_fraction", 0.05) is False
    assert met("kv_waste_fraction", 0.04) is True
    assert met("throughput_vs_batch1_at_16", 3.9) is False
    assert met("throughput_vs_vllm_at_16", None) is None


def test_the_worker_spin_count_reaches_only_the_workers_settings_when_given(tmp_path: Path) -> None:
    base = ServingConfig(tmp_path, 64 * 1024 * 1024, [1, 16], 2, 8, 32, 4096, "0-1")
    spinning = dataclasses.replace(base, worker_openmp_spin_count=30000)
    assert (
        "openmp_spin_count"
        not in batch_stack(tmp_path, base, 0, max_batch_sequences=None).spec.worker_settings
    )
    stack = batch_stack(tmp_path, spinning, 0, max_batch_sequences=1)
    assert stack.spec.worker_settings["openmp_spin_count"] == 30000
    assert stack.spec.worker_settings["max_batch_sequences"] == 1
    assert "openmp_spin_count" not in stack.spec.daemon_settings
    assert parse_args(["--worker-openmp-spin-count", "30000"]).worker_openmp_spin_count == 30000
    assert parse_args([]).worker_openmp_spin_count is None
