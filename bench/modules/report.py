"""The prompt-module benchmark's table, targets, summary and figure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common.plot_style import PALETTE, finish_axes, plt, save_figure
from bench.modules.measure import COMPACT_DEVIATION, REPAIR_FRACTIONS, REPAIR_METHODS, CaseResult
from inference_worker.modules.repair_selection import RepairMethod

TARGET_DOC_QA = 20.0  # x TTFT (the paper's CPU band is 20-70x)
TARGET_4K = 50.0
TARGET_PPL_NO_REPAIR = 0.05
TARGET_PPL_REPAIR = 0.01
TARGET_REPAIR_BUDGET = 0.15
MULTI_MODULE = ("doc_qa", "code", "persona", "travel")  # the workloads whose prompts join modules


def format_table(rows: list[CaseResult]) -> str:
    largest = REPAIR_FRACTIONS[-1]
    head = (
        f"{'workload':<8} {'case':<20} {'module':>6} {'prompt':>6} {'full ms':>9} {'modules ms':>10} {'x':>6} "
        f"{'ppl full':>8} {'ppl mod':>8} {'ppl rep':>8} {'ppl dev':>8} {'agree':>5} {'agr rep':>7} {'agr dev':>7} "
        f"{'bf16 ms':>8} {'x bf16':>6} {'ppl bf16':>8} {'read ms':>8} {'x read':>6}"
    )
    lines = [head, "-" * len(head), f"(repair: {largest:.0%} of each module but the first)"]
    for r in rows:
        first, deviation = r.point("first", largest), r.point("deviation", largest)
        lines.append(
            f"{r.workload:<8} {r.label:<20} {r.module_tokens:>6} {r.prompt_tokens:>6} {r.ttft_full_ms:>9.1f} "
            f"{r.ttft_modules_ms:>10.1f} {r.speedup:>6.1f} {r.ppl_full:>8.2f} {r.ppl_modules:>8.2f} "
            f"{_num(first and first.ppl, 8, '.2f')} {_num(deviation and deviation.ppl, 8, '.2f')} "
            f"{r.agree_no_repair:>5.2f} {_num(r.agree_repair, 7, '.2f')} {_num(r.agree_repair_deviation, 7, '.2f')} "
            f"{_num(r.ttft_modules_bf16_ms, 8, '.1f')} {_num(r.speedup_bf16, 6, '.1f')} "
            f"{_num(r.ppl_modules_bf16, 8, '.2f')} {_num(r.ttft_modules_read_ms, 8, '.1f')} "
            f"{_num(r.speedup_read, 6, '.1f')}"
        )
    joined = [r for r in rows if r.workload in MULTI_MODULE]
    if not joined:  # a run of the length sweep alone (--only length)
        return "\n".join(lines)
    lines.append("")
    lines.append("perplexity from full prefill vs repair budget (prompts of several modules):")
    for method in REPAIR_METHODS:
        unrepaired = _ppl_delta(
            joined, _compact_ppl if method == COMPACT_DEVIATION else lambda r: r.ppl_modules
        )
        cells = [f"0%: {unrepaired:.2%}"] + [
            f"{fraction:.0%}: {_curve_delta(rows, method, fraction):.2%}" for fraction in REPAIR_FRACTIONS
        ]
        lines.append(f"  {method:<17} " + "  ".join(cells))
    return "\n".join(lines)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _mean(values: list[float]) -> float | None:
    return statistics.mean(values) if values else None  # rows of runs before a field was measured have none


def _bf16_delta(rows: list[CaseResult]) -> float | None:
    return _mean(
        [abs(r.ppl_modules_bf16 / r.ppl_modules - 1) for r in rows if r.ppl_modules_bf16 is not None]
    )


def _num(value: float | None, width: int, spec: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def _ppl_delta(rows: list[CaseResult], ppl: Callable[[CaseResult], float]) -> float:
    """The mean distance of the perplexity from the full prefill's, relative (either side)."""
    return statistics.mean(abs(ppl(r) / r.ppl_full - 1) for r in rows)


def _ppl_loss(rows: list[CaseResult], ppl: Callable[[CaseResult], float]) -> float:
    """The mean rise of the perplexity over the full prefill's (a prompt served with a lower
    one counts 0): the loss side of `_ppl_delta`."""
    return statistics.mean(max(0.0, ppl(r) / r.ppl_full - 1) for r in rows)


def _ppl_ratio(rows: list[CaseResult], ppl: Callable[[CaseResult], float]) -> float:
    """The geometric mean of perplexity / the full prefill's, less 1 (signed; the pooled
    reference tokens' perplexity ratio when every reference has the same length)."""
    return math.exp(statistics.mean(math.log(ppl(r) / r.ppl_full) for r in rows)) - 1


def _reordered_delta(rows: list[CaseResult]) -> float | None:
    """The measure's own spread: how far the full prefill's perplexity moves with the
    prompt's modules in another order."""
    return _mean(
        [abs(r.ppl_full_reordered / r.ppl_full - 1) for r in rows if r.ppl_full_reordered is not None]
    )


def _compact_ppl(row: CaseResult) -> float:
    if row.ppl_modules_compact is None:
        raise ValueError(f"row {row.label} has no compact perplexity (a run before it was measured)")
    return row.ppl_modules_compact


def _repairable(rows: list[CaseResult]) -> list[CaseResult]:
    return [r for r in rows if r.curve]


def _point_ppl(method: str, fraction: float) -> Callable[[CaseResult], float]:
    def ppl(row: CaseResult) -> float:
        point = row.point(method, fraction)
        assert point is not None
        return point.ppl

    return ppl


def _curve_delta(rows: list[CaseResult], method: str, fraction: float) -> float:
    return _ppl_delta(_repairable(rows), _point_ppl(method, fraction))


def _budget(rows: list[CaseResult], fraction: float) -> float:
    """Repaired tokens over module tokens (all modules, the first included) at `fraction`."""
    repairable = _repairable(rows)
    repaired = sum(point.repaired_tokens for r in repairable if (point := r.point("first", fraction)))
    return repaired / sum(r.module_tokens for r in repairable)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _median_speedup(rows: list[CaseResult], workload: str) -> float | None:
    picked = [r.speedup for r in rows if r.workload == workload]
    return round(statistics.median(picked), 2) if picked else None


def summarize(rows: list[CaseResult]) -> dict[str, Any]:
    """Speedups; perplexity deltas over the prompts of several modules (a single module at
    position 0 is exact: `ppl_delta_single_module`); with repair, the best configuration
    the worker serves (first or deviation at schema positions, deviation at compact ones)
    at the largest budget, and the whole curve."""
    sweep = {int(r.label): r for r in rows if r.workload == "length"}
    joined = [r for r in rows if r.workload in MULTI_MODULE]
    repairable = _repairable(rows)
    largest_module = max(sweep) if sweep else None
    largest = REPAIR_FRACTIONS[-1]
    curve = (
        {
            method: {f"{f:.2f}": round(_curve_delta(rows, method, f), 4) for f in REPAIR_FRACTIONS}
            for method in REPAIR_METHODS
        }
        if repairable
        else {}
    )
    served = [  # the worker's configurations (method x positions), not bench variants
        curve[m][f"{largest:.2f}"]
        for m in (*(m.value for m in RepairMethod), COMPACT_DEVIATION)
        if m in curve
    ]
    with_repair = min(served, default=None)
    qa = [r for r in rows if r.workload == "doc_qa"]
    default_repair = _point_ppl(COMPACT_DEVIATION, largest)  # the worker's defaults at the largest budget
    return {
        "ttft_speedup_4k_module": round(sweep[4096].speedup, 2) if 4096 in sweep else None,
        "ttft_speedup_4k_module_bf16": _round(sweep[4096].speedup_bf16, 2) if 4096 in sweep else None,
        # The bf16 store's own perplexity cost: its distance from the fp32 store's, every prompt.
        "ppl_delta_bf16_store": _round(_bf16_delta(rows), 4),
        "greedy_agreement_bf16_store": _round(
            _mean([r.agree_bf16 for r in rows if r.agree_bf16 is not None]), 3
        ),
        "ttft_speedup_largest_module": round(sweep[largest_module].speedup, 2) if largest_module else None,
        "largest_module_tokens": largest_module,
        "ttft_speedup_doc_qa": _median_speedup(rows, "doc_qa"),
        # Modules read from the daemon, not the worker's memory (module_cache_bytes=0).
        "ttft_speedup_doc_qa_read": _round(
            _median([r.speedup_read for r in qa if r.speedup_read is not None]), 2
        ),
        "ttft_speedup_4k_module_read": _round(sweep[4096].speedup_read, 2) if 4096 in sweep else None,
        "ttft_speedup_code": _median_speedup(rows, "code"),
        "ttft_speedup_persona": _median_speedup(rows, "persona"),
        "ttft_speedup_travel": _median_speedup(rows, "travel"),
        "ppl_delta_no_repair": round(_ppl_delta(joined, lambda r: r.ppl_modules), 4) if joined else None,
        "ppl_delta_no_repair_compact": round(_ppl_delta(joined, _compact_ppl), 4) if joined else None,
        "ppl_delta_with_repair_compact": curve.get(COMPACT_DEVIATION, {}).get(f"{largest:.2f}"),
        "ppl_delta_with_repair": with_repair,
        "ppl_delta_with_repair_first": curve.get("first", {}).get(f"{largest:.2f}"),
        "ppl_delta_with_repair_deviation": curve.get("deviation", {}).get(f"{largest:.2f}"),
        "ppl_delta_curve": curve,
        # The same perplexities one-sided (a rise only) and signed (geometric mean), with the
        # worker's default layout (compact) and repair (deviation, the largest budget); and the
        # full prefill's own move when the modules are reordered.
        "ppl_loss_no_repair": round(_ppl_loss(joined, _compact_ppl), 4) if joined else None,
        "ppl_loss_with_repair": round(_ppl_loss(repairable, default_repair), 4) if repairable else None,
        "ppl_ratio_no_repair": round(_ppl_ratio(joined, _compact_ppl), 4) if joined else None,
        "ppl_ratio_with_repair": round(_ppl_ratio(repairable, default_repair), 4) if repairable else None,
        "ppl_delta_reordered": _round(_reordered_delta(joined), 4),
        "ppl_delta_single_module": round(_ppl_delta(list(sweep.values()), lambda r: r.ppl_modules), 4)
        if sweep
        else None,
        "repair_budget_fraction": round(_budget(rows, largest), 3) if repairable else None,
        "greedy_agreement_no_repair": round(statistics.mean(r.agree_no_repair for r in joined), 3)
        if joined
        else None,
        "greedy_agreement_with_repair": round(statistics.mean(r.agree_repair or 0.0 for r in repairable), 3)
        if repairable
        else None,
        "greedy_agreement_with_repair_deviation": round(
            statistics.mean(r.agree_repair_deviation or 0.0 for r in repairable), 3
        )
        if repairable
        else None,
        "ttft_speedup_doc_qa_repair_deviation": round(
            statistics.median(r.ttft_full_ms / (r.ttft_repair_deviation_ms or r.ttft_modules_ms) for r in qa),
            2,
        )
        if qa
        else None,
    }


def verdicts(summary: dict[str, Any]) -> list[str]:
    def line(ok: bool | None, text: str) -> str:
        return f"{'n/a ' if ok is None else 'PASS' if ok else 'FAIL'} {text}"

    def below(value: float | None, target: float) -> bool | None:
        return None if value is None else value <= target

    def share(key: str) -> str:
        return (
            "-"
            if summary[key] is None
            else f"{summary[key]:+.2%}"
            if "ratio" in key
            else f"{summary[key]:.2%}"
        )

    qa, big = summary["ttft_speedup_doc_qa"], summary["ttft_speedup_4k_module"]
    plain, repaired, budget = (
        summary["ppl_delta_no_repair"],
        summary["ppl_delta_with_repair"],
        summary["repair_budget_fraction"],
    )
    return [
        line(None if qa is None else qa >= TARGET_DOC_QA, f"doc-QA TTFT speedup {qa}x >= {TARGET_DOC_QA:g}x"),
        line(
            None if big is None else big >= TARGET_4K,
            f"4,096-token module TTFT speedup {'(not run)' if big is None else f'{big}x'} >= {TARGET_4K:g}x",
        ),
        line(
            below(plain, TARGET_PPL_NO_REPAIR),
            f"perplexity {plain if plain is None else f'{plain:.2%}'} from full prefill without repair "
            f"<= {TARGET_PPL_NO_REPAIR:.0%}",
        ),
        line(
            None
            if repaired is None or budget is None
            else repaired <= TARGET_PPL_REPAIR and budget <= TARGET_REPAIR_BUDGET,
            f"perplexity {repaired if repaired is None else f'{repaired:.2%}'} from full prefill with repair of "
            f"{budget if budget is None else f'{budget:.0%}'} of module tokens <= {TARGET_PPL_REPAIR:.0%}",
        ),
        (
            f"info perplexity rise over full prefill (a lower one counts 0) {share('ppl_loss_no_repair')} "
            f"without repair, {share('ppl_loss_with_repair')} with repair; geometric mean "
            f"{share('ppl_ratio_no_repair')} / {share('ppl_ratio_with_repair')}; the full prefill itself "
            f"{share('ppl_delta_reordered')} from its modules reordered"
        ),
    ]


def plot(rows: list[CaseResult], title: str, out: Path) -> None:
    """Left: TTFT against module length, the whole prompt prefilled vs served from module
    KV. Right: perplexity from full prefill against the repair budget."""
    sweep = sorted((r for r in rows if r.workload == "length"), key=lambda r: int(r.label))
    fig, (ax, curve_ax) = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True)
    x = [int(r.label) for r in sweep]
    ax.plot(x, [r.ttft_full_ms for r in sweep], marker="o", color=PALETTE[0], label="full prefill")
    ax.plot(
        x, [r.ttft_modules_ms for r in sweep], marker="s", color=PALETTE[1], label="module KV from the store"
    )
    if any(r.ttft_modules_bf16_ms for r in sweep):
        ax.plot(
            x,
            [r.ttft_modules_bf16_ms for r in sweep],
            marker="^",
            color=PALETTE[-1],
            label="module KV from the store, bf16",
        )
    if sweep:  # a run of other workloads only (--only) has no sweep to draw
        ax.set_xscale("log", base=2)
    finish_axes(ax, "module tokens (plus a short question)", "TTFT, ms (lower is better)", log_y=bool(sweep))
    joined = [r for r in rows if r.workload in MULTI_MODULE]
    if _repairable(rows):
        budgets = [0.0, *REPAIR_FRACTIONS]
        for color, method in zip(PALETTE[2:], REPAIR_METHODS, strict=False):
            unrepaired = _compact_ppl if method == COMPACT_DEVIATION else (lambda r: r.ppl_modules)
            deltas = [_ppl_delta(joined, unrepaired)]
            deltas += [_curve_delta(rows, method, f) for f in REPAIR_FRACTIONS]
            curve_ax.plot(
                [b * 100 for b in budgets],
                [d * 100 for d in deltas],
                marker="o",
                color=color,
                label=f"repair: {method}",
            )
        curve_ax.axhline(TARGET_PPL_REPAIR * 100, color="grey", linestyle="--", label="target with repair")
    finish_axes(
        curve_ax,
        "repair budget, % of each module's tokens (but the first module's)",
        "perplexity from full prefill, % (lower is better)",
    )
    save_figure(fig, title, out)
