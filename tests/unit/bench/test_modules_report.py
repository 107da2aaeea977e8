"""The prompt-module benchmark's summary: the 4k speedup only when a 4,096-token module ran,
doc-QA as the median, perplexity deltas as the workload's perplexity over the full
prefill's (signed) over the prompts of several modules, the repair curve per method and budget (the better served method at the
largest budget is the headline; the compact layout's figures beside it), the repair budget over the module tokens, and n/a, PASS
and FAIL verdicts; the cores a document-QA module turn kept busy."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench.modules.measure import REPAIR_FRACTIONS, REPAIR_METHODS, CaseResult, RepairPoint
from bench.modules.report import summarize, verdicts

LARGEST = REPAIR_FRACTIONS[-1]


def row(
    workload: str,
    label: str,
    full_ms: float,
    modules_ms: float,
    ppl: tuple[float, float],
    repaired: dict[str, float] | None = None,
    compact: float | None = None,
) -> CaseResult:
    """`repaired`: the perplexity per method at the largest budget; smaller budgets 10% off."""
    full, modules = ppl
    curve = (
        tuple(
            RepairPoint(method, f, int(f * 1000), repaired[method] if f == LARGEST else full * 1.1)
            for method in REPAIR_METHODS
            for f in REPAIR_FRACTIONS
        )
        if repaired
        else ()
    )
    return CaseResult(
        workload=workload,
        label=label,
        module_tokens=1000,
        prompt_tokens=1020,
        ttft_full_ms=full_ms,
        ttft_modules_ms=modules_ms,
        ppl_full=full,
        ppl_modules=modules,
        agree_no_repair=0.5,
        curve=curve,
        agree_repair=1.0 if curve else None,
        agree_repair_deviation=0.75 if curve else None,
        ttft_repair_deviation_ms=modules_ms * 2 if curve else None,
        ppl_modules_compact=modules if compact is None else compact,
        reference_tokens=32,
    )


def same(ppl: float) -> dict[str, float]:
    return dict.fromkeys(REPAIR_METHODS, ppl)


def test_summary_and_verdicts() -> None:
    rows = [
        row("length", "1024", 1000.0, 20.0, (10.0, 10.0)),
        row(
            "doc_qa",
            "q0",
            600.0,
            20.0,
            (10.0, 11.0),
            {**same(10.3), "first": 10.05, "deviation": 10.2, "deviation+compact": 10.01},
            compact=10.6,
        ),
        row("doc_qa", "q1", 900.0, 30.0, (10.0, 9.7), same(10.0)),  # lower counts as far as higher
        row("doc_qa", "q2", 300.0, 30.0, (10.0, 10.0), same(10.0)),
    ]
    summary = summarize(rows)
    assert summary["ttft_speedup_4k_module"] is None and summary["ttft_speedup_largest_module"] == 50.0
    assert summary["ttft_speedup_doc_qa"] == 30.0  # the median of 30, 30, 10

    def corpus(*ratios: float) -> float:  # equal reference lengths: the geometric mean
        return math.prod(ratios) ** (1 / len(ratios)) - 1

    assert summary["ppl_delta_no_repair"] == pytest.approx(corpus(1.1, 0.97, 1.0), abs=1e-4)  # doc-QA only
    assert summary["ppl_delta_no_repair_compact"] == pytest.approx(corpus(1.06, 0.97, 1.0), abs=1e-4)
    assert summary["ppl_case_mean_abs_delta_no_repair"] == pytest.approx((0.1 + 0.03 + 0) / 3, abs=1e-4)
    # the worker's defaults (deviation at compact positions), not the best of the curve
    assert summary["ppl_delta_with_repair"] == pytest.approx(corpus(1.001, 1, 1), abs=1e-4)
    assert summary["ppl_delta_with_repair_method"] == "deviation+compact"
    assert summary["ppl_delta_single_module"] == 0.0
    assert summary["ppl_delta_with_repair_first"] == pytest.approx(corpus(1.005, 1, 1), abs=1e-4)
    assert summary["ppl_delta_with_repair_deviation"] == pytest.approx(corpus(1.02, 1, 1), abs=1e-4)
    assert summary["ppl_delta_curve"]["first"][f"{REPAIR_FRACTIONS[0]:.2f}"] == pytest.approx(0.1)
    low, high = summary["ppl_delta_no_repair_ci95"]
    assert low <= summary["ppl_delta_no_repair"] <= high and low < high
    assert summary["quality_cases"] == 3 and summary["reference_tokens"] == 96
    assert summary["ppl_delta_no_repair_by_workload"] == {"doc_qa": summary["ppl_delta_no_repair"]}
    assert summary["greedy_agreement_with_repair_deviation"] == 0.75
    assert summary["ttft_speedup_doc_qa_repair_deviation"] == 15.0  # its TTFT twice the plain one
    assert summary["repair_budget_fraction"] == LARGEST and summary["greedy_agreement_with_repair"] == 1.0
    lines = verdicts(summary)
    assert lines[0].startswith("PASS") and lines[1].startswith("n/a")
    assert lines[2].startswith("PASS")  # +2.1% within 5%
    assert lines[3].startswith("PASS")  # 0.03% within 1% at 15% of module tokens
    assert verdicts({**summary, "ppl_delta_with_repair": 0.02})[3].startswith("FAIL")
    assert verdicts({**summary, "ppl_delta_with_repair": -0.02})[3].startswith("FAIL")  # either side
    assert verdicts({**summary, "repair_budget_fraction": 0.2})[3].startswith("FAIL")
    assert verdicts({**summary, "ppl_delta_no_repair": 0.2})[2].startswith("FAIL")


def test_the_speedups_of_modules_read_from_the_daemon_are_reported_beside() -> None:
    """`ttft_modules_read_ms`: every module read from the daemon (the worker's cache bypassed)."""
    rows = [
        replace(row("doc_qa", f"q{i}", 600.0, 20.0, (10.0, 10.0)), ttft_modules_read_ms=read)
        for i, read in enumerate((60.0, 30.0, 120.0))
    ]
    rows.append(replace(row("length", "4096", 8000.0, 100.0, (10.0, 10.0)), ttft_modules_read_ms=200.0))
    summary = summarize(rows)
    assert summary["ttft_speedup_doc_qa"] == 30.0 and summary["ttft_speedup_doc_qa_read"] == 10.0  # 600/60
    assert summary["ttft_speedup_4k_module"] == 80.0 and summary["ttft_speedup_4k_module_read"] == 40.0
    assert (
        summarize(rows[:1] + [row("doc_qa", "q9", 600.0, 20.0, (10.0, 10.0))])["ttft_speedup_doc_qa_read"]
        == 10.0
    )


def test_the_one_sided_perplexities_and_the_reordered_spread() -> None:
    """A perplexity below the full prefill's counts 0 in the loss (with the worker's
    defaults: compact, deviation at the largest budget); the reordered full prefill's
    distance is the measure's own spread, over the rows that have it."""
    rows = [
        replace(
            row("doc_qa", "q0", 600.0, 20.0, (10.0, 13.0), same(11.0), compact=12.0), ppl_full_reordered=10.5
        ),
        replace(
            row("doc_qa", "q1", 600.0, 20.0, (10.0, 7.0), same(8.0), compact=7.5), ppl_full_reordered=9.7
        ),
        row("length", "1024", 1000.0, 20.0, (10.0, 10.0)),
    ]
    summary = summarize(rows)
    assert summary["ppl_case_mean_abs_delta_no_repair"] == pytest.approx((0.3 + 0.3) / 2)  # either side
    assert summary["ppl_delta_no_repair"] == pytest.approx((1.3 * 0.7) ** 0.5 - 1, abs=1e-4)  # signed
    assert summary["ppl_loss_no_repair"] == pytest.approx(0.2 / 2)  # compact: +20%, and -25% counts 0
    assert summary["ppl_loss_with_repair"] == pytest.approx(0.1 / 2)  # +10%, -20%
    assert summary["ppl_case_mean_abs_delta_reordered"] == pytest.approx((0.05 + 0.03) / 2)
    assert summary["ppl_delta_reordered"] == pytest.approx((1.05 * 0.97) ** 0.5 - 1, abs=1e-4)
    assert verdicts(summary)[-1].startswith("info") and "+0.92%" in verdicts(summary)[-1]
    assert summarize(rows[2:])["ppl_delta_reordered"] is None  # the length sweep has no other order


def test_the_summary_reads_the_cores_a_module_turn_kept_busy() -> None:
    """A module turn's process CPU over its TTFT, the median over the document-QA prompts;
    none where a run's rows have no CPU (before it was measured)."""
    rows = [
        replace(row("doc_qa", label, 1500.0, ttft, (10.0, 10.0)), cpu_modules_ms=cpu)
        for label, ttft, cpu in (("q0", 100.0, 120.0), ("q1", 80.0, 160.0), ("q2", 50.0, 50.0))
    ]
    assert summarize(rows)["module_turn_cores_doc_qa"] == pytest.approx(1.2)
    assert summarize([row("doc_qa", "q0", 1500.0, 100.0, (10.0, 10.0))])["module_turn_cores_doc_qa"] is None
