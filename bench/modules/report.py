"""The prompt-module benchmark's table, targets, summary and figure."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common.plot_style import PALETTE, finish_axes, plt, save_figure
from bench.modules.measure import CaseResult

TARGET_DOC_QA = 20.0  # x TTFT (the paper's CPU band is 20-70x)
TARGET_4K = 50.0
TARGET_PPL_NO_REPAIR = 0.05
TARGET_PPL_REPAIR = 0.01


def format_table(rows: list[CaseResult]) -> str:
    head = (
        f"{'workload':<8} {'case':<14} {'module':>6} {'prompt':>6} {'full ms':>9} {'modules ms':>10} {'x':>6} "
        f"{'ppl full':>8} {'ppl mod':>8} {'ppl rep':>8} {'ppl dev':>8} {'agree':>5} {'agr rep':>7} {'agr dev':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.workload:<8} {r.label:<14} {r.module_tokens:>6} {r.prompt_tokens:>6} {r.ttft_full_ms:>9.1f} "
            f"{r.ttft_modules_ms:>10.1f} {r.speedup:>6.1f} {r.ppl_full:>8.2f} {r.ppl_modules:>8.2f} "
            f"{r.ppl_repair:>8.2f} {r.ppl_repair_deviation:>8.2f} {r.agree_no_repair:>5.2f} "
            f"{r.agree_repair:>7.2f} {r.agree_repair_deviation:>7.2f}"
        )
    return "\n".join(lines)


def _ppl_delta(rows: list[CaseResult], ppl: Callable[[CaseResult], float]) -> float:
    """The mean distance of the perplexity from the full prefill's, relative (either side)."""
    return statistics.mean(abs(ppl(r) / r.ppl_full - 1) for r in rows)


def summarize(rows: list[CaseResult]) -> dict[str, Any]:
    sweep = {int(r.label): r for r in rows if r.workload == "length"}
    qa = [r for r in rows if r.workload == "doc_qa"]
    largest = max(sweep) if sweep else None
    return {
        "ttft_speedup_4k_module": round(sweep[4096].speedup, 2) if 4096 in sweep else None,
        "ttft_speedup_largest_module": round(sweep[largest].speedup, 2) if largest else None,
        "largest_module_tokens": largest,
        "ttft_speedup_doc_qa": round(statistics.median(r.speedup for r in qa), 2) if qa else None,
        "ppl_delta_no_repair": round(_ppl_delta(rows, lambda r: r.ppl_modules), 4),
        "ppl_delta_with_repair": round(_ppl_delta(rows, lambda r: r.ppl_repair), 4),
        "ppl_delta_with_repair_deviation": round(_ppl_delta(rows, lambda r: r.ppl_repair_deviation), 4),
        "greedy_agreement_no_repair": round(statistics.mean(r.agree_no_repair for r in rows), 3),
        "greedy_agreement_with_repair": round(statistics.mean(r.agree_repair for r in rows), 3),
        "greedy_agreement_with_repair_deviation": round(
            statistics.mean(r.agree_repair_deviation for r in rows), 3
        ),
        "ttft_speedup_doc_qa_repair_deviation": round(
            statistics.median(r.ttft_full_ms / r.ttft_repair_deviation_ms for r in qa), 2
        )
        if qa
        else None,
        "repair_budget_fraction": round(
            sum(r.repaired_tokens for r in rows) / sum(r.module_tokens for r in rows), 3
        ),
    }


def verdicts(summary: dict[str, Any]) -> list[str]:
    def line(ok: bool | None, text: str) -> str:
        return f"{'n/a ' if ok is None else 'PASS' if ok else 'FAIL'} {text}"

    qa, big = summary["ttft_speedup_doc_qa"], summary["ttft_speedup_4k_module"]
    return [
        line(None if qa is None else qa >= TARGET_DOC_QA, f"doc-QA TTFT speedup {qa}x >= {TARGET_DOC_QA:g}x"),
        line(
            None if big is None else big >= TARGET_4K,
            f"4,096-token module TTFT speedup {'(not run)' if big is None else f'{big}x'} >= {TARGET_4K:g}x",
        ),
        line(
            summary["ppl_delta_no_repair"] <= TARGET_PPL_NO_REPAIR,
            f"perplexity {summary['ppl_delta_no_repair']:.2%} from full prefill without repair <= "
            f"{TARGET_PPL_NO_REPAIR:.0%}",
        ),
        line(
            summary["ppl_delta_with_repair"] <= TARGET_PPL_REPAIR
            and summary["repair_budget_fraction"] <= 0.15,
            f"perplexity {summary['ppl_delta_with_repair']:.2%} from full prefill with repair of "
            f"{summary['repair_budget_fraction']:.0%} of module tokens <= {TARGET_PPL_REPAIR:.0%}",
        ),
        line(
            summary["ppl_delta_with_repair_deviation"] <= TARGET_PPL_REPAIR
            and summary["repair_budget_fraction"] <= 0.15,
            f"perplexity {summary['ppl_delta_with_repair_deviation']:.2%} from full prefill with repair of "
            f"as many tokens chosen by KV deviation <= {TARGET_PPL_REPAIR:.0%}",
        ),
    ]


def plot(rows: list[CaseResult], title: str, out: Path) -> None:
    """TTFT against module length: the whole prompt prefilled vs served from module KV."""
    sweep = sorted((r for r in rows if r.workload == "length"), key=lambda r: int(r.label))
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    x = [int(r.label) for r in sweep]
    ax.plot(x, [r.ttft_full_ms for r in sweep], marker="o", color=PALETTE[0], label="full prefill")
    ax.plot(
        x, [r.ttft_modules_ms for r in sweep], marker="s", color=PALETTE[1], label="module KV from the store"
    )
    ax.set_xscale("log", base=2)
    finish_axes(ax, "module tokens (plus a short question)", "TTFT, ms (lower is better)", log_y=True)
    save_figure(fig, title, out)
