"""bench-restore's pieces: the file tier reads layer-major what was put, from a given layer
on; the summary takes the worst ratio over histories and judges the issue's targets."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

import bench.common.results as bench_results
import bench.restore.run as restore_run
from attnstore.chunks.format import decode_layout
from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from bench.restore.report import plot, summarize, throttled_tier
from bench.restore.run import device_problem, main
from bench.restore.samples import median_sample, paired_ratio, round_orders, spread
from bench.restore.tiers import FileTier
from inference_worker.kv_codec import encode_chunks


async def test_the_file_tier_reads_layer_major_from_a_layer_on(tmp_path: Path) -> None:
    namespace = NamespaceSpec("tiny", "float32", 4).namespace_id()
    keys = chunk_key_chain(namespace, list(range(8)), 4)
    kv = [(torch.randn(2, 8, 4), torch.randn(2, 8, 4)) for _ in range(3)]
    chunks = encode_chunks(namespace, keys, kv, 4, 0)
    tier = FileTier(tmp_path)
    for key, chunk in zip(keys, chunks, strict=True):
        tier.put(namespace, key, chunk)
    tier.drop_cache(namespace, keys)
    pieces = [piece async for piece in tier.iter_layers(namespace, keys, layer_start=1)]
    assert [(p.layer, p.chunk_index) for p in pieces] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for piece in pieces:
        start, end = decode_layout(chunks[piece.chunk_index]).layer_span(piece.layer, piece.layer + 1)
        assert piece.data == chunks[piece.chunk_index][start:end]


def rows(tier: str, tokens: int, seconds: dict[str, float]) -> list[dict]:
    per_token = {"kv": 100, "hidden": 50, "recompute": 0, "planner": 50}
    return [
        {
            "tier": tier,
            "history_tokens": tokens,
            "method": m,
            "seconds": s,
            "plan": m,
            "bytes_per_token": per_token[m],
            "timeline": {"wall_seconds": s, "io_seconds": s, "compute_seconds": s / 2, "overlap": 1.0},
        }
        for m, s in seconds.items()
    ]


def test_the_summary_takes_the_worst_history_and_judges_the_targets() -> None:
    slow = throttled_tier(0.1)
    table = (
        rows("dram", 1, {"recompute": 9.0, "kv": 1.0, "hidden": 2.0, "planner": 1.0})
        + rows("dram", 2, {"recompute": 9.0, "kv": 1.0, "hidden": 2.0, "planner": 1.2})
        + rows(slow, 1, {"recompute": 9.0, "kv": 4.0, "hidden": 3.0, "planner": 2.0})
        + rows(slow, 2, {"recompute": 9.0, "kv": 4.0, "hidden": 3.0, "planner": 2.5})
    )
    costs = {
        f"{slow}/{n}": {
            "modelled_best_vs_kv": modelled,
            "gbps_for_throttled_target": gbps,
            "mix_ceiling_vs_kv": mix,
            "predicted_ceiling_vs_kv": predicted,
            "predicted_ceiling_plan": plan,
        }
        for n, modelled, gbps, mix, predicted, plan in [
            (1, 2.1, 0.2, 1.9, 2.0, "r0h12k0"),
            (2, 1.7, 0.3, 1.8, 1.75, "r0h10k2"),
        ]
    }
    summary, verdicts = summarize(table, ["dram", slow], [1, 2], costs)
    assert slow == "throttled-0.1GBps"
    assert summary["planner_vs_best_single_method"] == {"dram": 1.2, slow: 0.833}
    assert summary["planner_vs_kv_load_throttled"] == {slow: 1.6}
    assert summary["modelled_best_vs_kv_load_throttled"] == {slow: 1.7}
    assert summary["throttled_gbps_for_target_at_measured_projection"] == {slow: 0.3}
    assert summary["mix_ceiling_vs_kv_load_throttled"] == {slow: 1.8}
    assert "ceiling on this machine, 1 + hidden read / projection: 1.80x" in verdicts[-2]
    assert "the best plan modelled on the run's costs: 1.75x" in verdicts[-2]
    assert summary["predicted_vs_measured_throttled"][f"{slow}/2"] == {
        "predicted_ceiling_vs_kv": 1.75,
        "predicted_ceiling_plan": "r0h10k2",
        "mix_ceiling_vs_kv": 1.8,
        "measured_vs_kv": 1.6,
    }
    assert summary["planner_timeline_throttled"][f"{slow}/2"]["compute_seconds"] == 1.25
    assert summary["hidden_vs_kv_bytes"] == 0.5
    assert [line.split()[0] for line in verdicts] == ["FAIL", "PASS", "PASS", "PASS"]


def test_the_figure_is_written(tmp_path: Path) -> None:
    table = rows("dram", 1, {"recompute": 9.0, "kv": 1.0, "hidden": 2.0, "planner": 1.0})
    plot(table, ["dram"], tmp_path / "restore.png")
    assert (tmp_path / "restore.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("device", "message"),
    [("nonsense", "not a torch device"), ("mps", "only cpu and cuda")]
    + ([] if torch.cuda.is_available() else [("cuda", "CUDA is not available on this machine")]),
)
def test_a_device_it_cannot_use_ends_the_run_with_a_readable_message(
    device: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--device", device, "--quick"])  # refused before any model or daemon starts
    assert exited.value.code == 2
    assert f"--device {device}: {message}" in capsys.readouterr().err


def test_cpu_and_cuda_where_present_are_usable() -> None:
    assert device_problem("cpu") is None
    assert (device_problem("cuda") is None) == torch.cuda.is_available()


def test_the_rounds_run_every_order_so_no_method_always_follows_the_same_one() -> None:
    orders = round_orders(3, 6)
    assert all(sorted(order) == [0, 1, 2] for order in orders)
    assert len(set(orders)) == 6
    followed = Counter(pair for order in orders for pair in itertools.pairwise(order))
    assert followed == {pair: 2 for pair in itertools.permutations(range(3), 2)}
    assert round_orders(3, 8)[6:] == orders[:2]
    assert round_orders(1, 2) == [(0,), (0,)]


def test_the_median_sample_is_a_measured_one_and_the_spread_is_slowest_over_fastest() -> None:
    samples = [(3.0, "c"), (1.0, "a"), (4.0, "d"), (2.0, "b")]
    assert median_sample(samples) == (2.0, "b")  # the lower middle of an even count
    assert median_sample(samples[:3]) == (3.0, "c")
    assert spread([2.0, 3.0, 2.5]) == 1.5
    assert spread([2.0]) == 1.0


def test_ratios_pair_the_samples_of_one_round() -> None:
    assert paired_ratio([2.0, 4.0, 6.0], [1.0, 4.0, 3.0]) == 2.0  # median of 2, 1, 2
    assert paired_ratio([10.0], [1.0, 2.0, 5.0]) == 5.0  # once-timed against every round
    assert paired_ratio([1.0, 2.0, 5.0], [10.0]) == 0.2


def test_the_summary_pairs_rounds_and_reports_each_tiers_sample_spread() -> None:
    slow = throttled_tier(0.1)
    samples = {"kv": [1.0, 3.0, 1.0], "planner": [1.1, 3.3, 0.9], "hidden": [2.0, 6.0, 2.2]}
    table = rows("dram", 1, {"recompute": 9.0, "kv": 1.0, "hidden": 2.0, "planner": 1.1})
    table += rows(slow, 1, {"recompute": 9.0, "kv": 1.0, "hidden": 2.0, "planner": 1.1})
    for row in table:
        row["samples_seconds"] = samples.get(row["method"], [row["seconds"]])
    summary, verdicts = summarize(table, ["dram", slow], [1], {})
    # per round 1.1, 1.1, 0.9 of KV's time: the median 1.1, whatever the rounds' spells
    assert summary["planner_vs_best_single_method"] == {"dram": 1.1, slow: 1.1}
    assert summary["planner_vs_kv_load_throttled"] == {slow: round(1 / 1.1, 3)}
    assert summary["sample_spread"] == {"dram": 3.667, slow: 3.667}  # planner: 3.3 / 0.9
    assert verdicts[0].startswith("FAIL planner vs best single method on dram: 1.100x")
    assert "samples of one method spread up to 3.67x on this tier" in verdicts[0]


def test_the_read_check_times_a_cached_and_a_dropped_read_and_leaves_no_file(tmp_path: Path) -> None:
    check = FileTier(tmp_path).read_check(1024 * 1024)
    assert set(check) == {"warm_gbps", "cold_gbps"}
    assert all(rate > 0 for rate in check.values())
    assert list(tmp_path.iterdir()) == []


TINY_RUN = [
    "--layers",
    "2",
    "--hidden",
    "128",
    "--chunk-tokens",
    "32",
    "--repeats",
    "2",
    "--throttled-gbps",
    "0.5",
]


@pytest.fixture
def results_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run's results and work directory under tmp_path (the committed results untouched)."""
    results = tmp_path / "results"
    monkeypatch.setattr(bench_results, "RESULTS_DIR", results)
    monkeypatch.setattr(restore_run, "RESULTS_DIR", results)
    monkeypatch.setattr(restore_run, "WORK_DIR", tmp_path / "work")
    return results


def test_a_whole_run_writes_its_results_and_no_partial_file(
    results_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main([*TINY_RUN, "--histories", "64", "96"])
    document = json.loads((results_dir / "restore.json").read_text())
    assert document["histories_done"] == [64, 96]
    assert {row["history_tokens"] for row in document["rows"]} == {64, 96}
    assert len(document["rows"]) == 2 * 3 * 4  # histories x tiers (DRAM, disk, one throttled) x methods
    assert not (results_dir / "restore-partial.json").exists()
    assert (results_dir / "restore.png").exists()
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == document["summary"]


def test_a_run_cut_short_keeps_the_histories_it_finished(
    results_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured = restore_run.Bench.history

    async def cut_at_the_second(self: restore_run.Bench, tokens: int) -> list[dict]:
        if tokens == 96:
            raise SystemExit(143)  # as the SIGTERM handler does
        return await measured(self, tokens)

    monkeypatch.setattr(restore_run.Bench, "history", cut_at_the_second)
    with pytest.raises(SystemExit):
        main([*TINY_RUN, "--histories", "64", "96"])
    document = json.loads((results_dir / "restore-partial.json").read_text())
    assert document["histories_done"] == [64]
    assert document["summary"]["hidden_vs_kv_bytes"] == 0.5
    assert not (results_dir / "restore.json").exists()
    assert not (tmp_path / "work" / "files").exists()  # the disk tier's chunk files
