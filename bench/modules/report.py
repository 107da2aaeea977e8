"""The prompt-module benchmark's table, targets, summary and figure."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common.plot_style import PALETTE, finish_axes, plt, save_figure
from bench.modules.corpus_perplexity import corpus_delta, corpus_interval
from bench.modules.measure import COMPACT_DEVIATION, REPAIR_FRACTIONS, REPAIR_METHODS, CaseResult

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
    lines.append(
        "workload perplexity over full prefill's, less 1, vs repair budget (prompts of several modules):"
    )
    for method in REPAIR_METHODS:
        unrepaired = corpus_delta(joined, _compact_ppl if method == COMPACT_DEVIATION else _plain_ppl)
        cells = [f"0%: {unrepaired:+.2%}"] + [
            f"{fraction:.0%}: {_curve_delta(rows, method, fraction):+.2%}" for fraction in REPAIR_FRACTIONS
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


def _case_mean_abs_delta(rows: list[CaseResult], ppl: Callable[[CaseResult], float]) -> float:
    """The per-case mean of |ppl / ppl_full - 1| (secondary: each prompt's own distance, a
    lower perplexity counted as far as a higher one; not the workload's perplexity)."""
    return statistics.mean(abs(ppl(r) / r.ppl_full - 1) for r in rows)


def _ppl_loss(rows: list[CaseResult], ppl: Callable[[CaseResult], float]) -> float:
    """The mean rise of the perplexity over the full prefill's (a prompt served with a lower
    one counts 0)."""
    return statistics.mean(max(0.0, ppl(r) / r.ppl_full - 1) for r in rows)


def _interval(rows: list[CaseResult], ppl: Callable[[CaseResult], float]) -> list[float]:
    found = corpus_interval(rows, ppl)
    return [round(found.low, 4), round(found.high, 4)]


def _reordered_ppl(row: CaseResult) -> float:
    assert row.ppl_full_reordered is not None
    return row.ppl_full_reordered


def _reordered(rows: list[CaseResult]) -> list[CaseResult]:
    """The rows with a reordered twin (the measure's own spread: the full prefill's
    perplexity with the prompt's modules in another order)."""
    return [r for r in rows if r.ppl_full_reordered is not None]


def _plain_ppl(row: CaseResult) -> float:
    return row.ppl_modules


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
    return corpus_delta(_repairable(rows), _point_ppl(method, fraction))


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


def _quality(rows: list[CaseResult], curve: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The perplexity keys: `ppl_delta_*` are the workload's perplexity (exp of the mean NLL
    over every reference token of the prompts of several modules) over the full prefill's on
    the same tokens, less 1, signed, with a 95% bootstrap interval over the prompts; without
    repair at schema positions (the paper's layout), with repair the worker's defaults
    (compact positions, deviation) at the largest budget: a fixed configuration, not the
    best of the curve, which would bias the delta towards 0. Beside them: the
    per-case mean |ppl / ppl_full - 1| (`ppl_case_mean_abs_delta_*`), the mean rise with a
    lower perplexity counted 0 (`ppl_loss_*`, the worker's defaults: compact, deviation), the
    no-repair delta of each workload, and the full prefill's own move with the modules
    reordered (`ppl_delta_reordered`)."""
    joined = [r for r in rows if r.workload in MULTI_MODULE]
    sweep = [r for r in rows if r.workload == "length"]
    repairable, reordered = _repairable(rows), _reordered(joined)
    largest = f"{REPAIR_FRACTIONS[-1]:.2f}"
    method = COMPACT_DEVIATION if COMPACT_DEVIATION in curve else None
    repaired = _point_ppl(method, REPAIR_FRACTIONS[-1]) if method else None
    return {
        "ppl_delta_no_repair": round(corpus_delta(joined, _plain_ppl), 4) if joined else None,
        "ppl_delta_no_repair_ci95": _interval(joined, _plain_ppl) if joined else None,
        "ppl_delta_no_repair_compact": round(corpus_delta(joined, _compact_ppl), 4) if joined else None,
        "ppl_delta_with_repair": curve[method][largest] if method else None,
        "ppl_delta_with_repair_ci95": _interval(repairable, repaired) if repaired else None,
        "ppl_delta_with_repair_method": method,
        "ppl_delta_with_repair_first": curve.get("first", {}).get(largest),
        "ppl_delta_with_repair_deviation": curve.get("deviation", {}).get(largest),
        "ppl_delta_curve": curve,
        "ppl_delta_no_repair_by_workload": {
            name: round(corpus_delta(picked, _plain_ppl), 4)
            for name in MULTI_MODULE
            if (picked := [r for r in joined if r.workload == name])
        },
        "ppl_delta_reordered": round(corpus_delta(reordered, _reordered_ppl), 4) if reordered else None,
        "ppl_delta_reordered_ci95": _interval(reordered, _reordered_ppl) if reordered else None,
        "ppl_delta_single_module": round(corpus_delta(sweep, _plain_ppl), 4) if sweep else None,
        "quality_cases": len(joined),
        "reference_tokens": sum(r.reference_tokens or 0 for r in joined),
        "ppl_case_mean_abs_delta_no_repair": round(_case_mean_abs_delta(joined, _plain_ppl), 4)
        if joined
        else None,
        "ppl_case_mean_abs_delta_with_repair": round(_case_mean_abs_delta(repairable, repaired), 4)
        if repaired
        else None,
        "ppl_case_mean_abs_delta_reordered": round(_case_mean_abs_delta(reordered, _reordered_ppl), 4)
        if reordered
        else None,
        "ppl_loss_no_repair": round(_ppl_loss(joined, _compact_ppl), 4) if joined else None,
        "ppl_loss_with_repair": round(_ppl_loss(repairable, repaired), 4) if repaired else None,
    }


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
    qa = [r for r in rows if r.workload == "doc_qa"]
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
        # The module turn's CPU over its TTFT: how many of the cores it kept busy.
        "module_turn_cores_doc_qa": _round(
            _median([r.cpu_modules_ms / r.ttft_modules_ms for r in qa if r.cpu_modules_ms is not None]), 2
        ),
        "ttft_speedup_code": _median_speedup(rows, "code"),
        "ttft_speedup_persona": _median_speedup(rows, "persona"),
        "ttft_speedup_travel": _median_speedup(rows, "travel"),
        **_quality(rows, curve),
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


def _decided(value: float, interval: list[float] | None, target: float) -> str:
    """Whether the bootstrap interval lies on the point estimate's side of the band +-target
    (the run's prompts tell PASS from FAIL), or straddles a bound (more prompts needed)."""
    if interval is None:
        return ""
    low, high = interval
    inside = -target <= low and high <= target
    outside = high < -target or low > target
    decided = inside if abs(value) <= target else outside
    return f", 95% CI [{low:+.2%}, {high:+.2%}]: {'decided' if decided else 'not decided at this size'}"


def verdicts(summary: dict[str, Any]) -> list[str]:
    """The targets; a perplexity is within its target when the workload's perplexity is
    within +-target of the full prefill's (the issue's words), its interval printed beside."""

    def line(ok: bool | None, text: str) -> str:
        return f"{'n/a ' if ok is None else 'PASS' if ok else 'FAIL'} {text}"

    def share(key: str) -> str:
        return "-" if summary[key] is None else f"{summary[key]:.2%}"

    qa, big = summary["ttft_speedup_doc_qa"], summary["ttft_speedup_4k_module"]
    plain, repaired, budget = (
        summary["ppl_delta_no_repair"],
        summary["ppl_delta_with_repair"],
        summary["repair_budget_fraction"],
    )
    reordered = summary["ppl_delta_reordered"]
    return [
        line(None if qa is None else qa >= TARGET_DOC_QA, f"doc-QA TTFT speedup {qa}x >= {TARGET_DOC_QA:g}x"),
        line(
            None if big is None else big >= TARGET_4K,
            f"4,096-token module TTFT speedup {'(not run)' if big is None else f'{big}x'} >= {TARGET_4K:g}x",
        ),
        line(
            None if plain is None else abs(plain) <= TARGET_PPL_NO_REPAIR,
            "perplexity without repair "
            + ("-" if plain is None else f"{plain:+.2%}")
            + f" from full prefill's, within +-{TARGET_PPL_NO_REPAIR:.0%}"
            + (
                ""
                if plain is None
                else _decided(plain, summary["ppl_delta_no_repair_ci95"], TARGET_PPL_NO_REPAIR)
            ),
        ),
        line(
            None
            if repaired is None or budget is None
            else abs(repaired) <= TARGET_PPL_REPAIR and budget <= TARGET_REPAIR_BUDGET,
            "perplexity with repair "
            + ("-" if repaired is None else f"{repaired:+.2%} ({summary['ppl_delta_with_repair_method']})")
            + f" of {budget if budget is None else f'{budget:.0%}'} of module tokens from full prefill's, "
            f"within +-{TARGET_PPL_REPAIR:.0%}"
            + (
                ""
                if repaired is None
                else _decided(repaired, summary["ppl_delta_with_repair_ci95"], TARGET_PPL_REPAIR)
            ),
        ),
        (
            f"info the full prefill with its modules reordered {'-' if reordered is None else f'{reordered:+.2%}'}; "
            f"per-case mean |ppl / ppl_full - 1| {share('ppl_case_mean_abs_delta_no_repair')} without repair, "
            f"{share('ppl_case_mean_abs_delta_with_repair')} with, {share('ppl_case_mean_abs_delta_reordered')} "
            f"reordered; mean rise (a lower one counts 0) {share('ppl_loss_no_repair')} / "
            f"{share('ppl_loss_with_repair')}; {summary['quality_cases']} prompts, "
            f"{summary['reference_tokens']} reference tokens"
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
            unrepaired = _compact_ppl if method == COMPACT_DEVIATION else _plain_ppl
            deltas = [corpus_delta(joined, unrepaired)]
            deltas += [_curve_delta(rows, method, f) for f in REPAIR_FRACTIONS]
            curve_ax.plot(
                [b * 100 for b in budgets],
                [d * 100 for d in deltas],
                marker="o",
                color=color,
                label=f"repair: {method}",
            )
        for bound in (TARGET_PPL_REPAIR, -TARGET_PPL_REPAIR):
            curve_ax.axhline(
                bound * 100, color="grey", linestyle="--", label="target with repair" if bound > 0 else None
            )
    finish_axes(
        curve_ax,
        "repair budget, % of each module's tokens (but the first module's)",
        "workload perplexity over full prefill's, % (0 is best)",
    )
    save_figure(fig, title, out)
