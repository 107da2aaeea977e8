"""The prompt-module benchmark's summary: the 4k speedup only when a 4,096-token module ran,
doc-QA as the median, perplexity deltas relative to the full prefill, the repair budget
over the module tokens (first-token and deviation repair), and n/a, PASS and FAIL verdicts."""

from __future__ import annotations

import pytest

from bench.modules.measure import CaseResult
from bench.modules.report import summarize, verdicts


def row(
    workload: str, label: str, full_ms: float, modules_ms: float, ppl: tuple[float, float, float, float]
) -> CaseResult:
    return CaseResult(
        workload=workload,
        label=label,
        module_tokens=1000,
        prompt_tokens=1020,
        repaired_tokens=100,
        ttft_full_ms=full_ms,
        ttft_modules_ms=modules_ms,
        ppl_full=ppl[0],
        ppl_modules=ppl[1],
        ppl_repair=ppl[2],
        ppl_repair_deviation=ppl[3],
        agree_no_repair=0.5,
        agree_repair=1.0,
        agree_repair_deviation=0.75,
        ttft_repair_deviation_ms=modules_ms * 2,
    )


def test_summary_and_verdicts() -> None:
    rows = [
        row("length", "1024", 1000.0, 20.0, (10.0, 10.0, 10.0, 10.0)),
        row("doc_qa", "q0", 600.0, 20.0, (10.0, 11.0, 10.05, 10.2)),
        row("doc_qa", "q1", 900.0, 30.0, (10.0, 9.7, 10.0, 10.0)),  # lower counts as far as higher
        row("doc_qa", "q2", 300.0, 30.0, (10.0, 10.0, 10.0, 10.0)),
    ]
    summary = summarize(rows)
    assert summary["ttft_speedup_4k_module"] is None and summary["ttft_speedup_largest_module"] == 50.0
    assert summary["ttft_speedup_doc_qa"] == 30.0  # the median of 30, 30, 10
    assert summary["ppl_delta_no_repair"] == pytest.approx((0 + 0.1 + 0.03 + 0) / 4, abs=1e-4)
    assert summary["ppl_delta_with_repair"] == pytest.approx(0.005 / 4, abs=1e-4)  # rounded to 4 places
    assert summary["ppl_delta_with_repair_deviation"] == pytest.approx(0.02 / 4, abs=1e-4)
    assert summary["greedy_agreement_with_repair_deviation"] == 0.75
    assert summary["ttft_speedup_doc_qa_repair_deviation"] == 15.0  # its TTFT twice the plain one
    assert summary["repair_budget_fraction"] == 0.1 and summary["greedy_agreement_with_repair"] == 1.0
    lines = verdicts(summary)
    assert lines[0].startswith("PASS") and lines[1].startswith("n/a") and lines[3].startswith("PASS")
    assert lines[2].startswith("PASS")  # +3.25% <= 5%
    assert lines[4].startswith("PASS")  # 0.5% <= 1%
    assert verdicts({**summary, "ppl_delta_with_repair_deviation": 0.02})[4].startswith("FAIL")
    assert verdicts({**summary, "ppl_delta_no_repair": 0.2})[2].startswith("FAIL")
