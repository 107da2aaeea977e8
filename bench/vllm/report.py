"""What bench-vllm prints and saves besides its summary: a table per phase and side (later
turns' median TTFT, tokens/s, hit tokens), the targets as PASS/FAIL lines, and the figure
(median TTFT per turn, vLLM alone vs with the connector, per phase)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench.common.plot_style import plt, save_figure

SIDES = ("vllm", "vllm+attnstore")
PHASES = ("fits", "over capacity")
TARGETS = {
    "over capacity": ("later_turn_ttft_with_connector_vs_without", 0.5),
    "fits": ("later_turn_ttft_with_connector_vs_without_fits", 1.05),
}


def format_table(summary: dict[str, Any]) -> str:
    header = f"{'phase':<14} {'side':<15} {'later-turn TTFT ms':>18} {'tokens/s':>9} {'connector hits':>14}"
    lines = [header, "-" * len(header)]
    for phase in PHASES:
        for side in SIDES:
            ttft = summary["later_turn_median_ttft_ms"][phase][side]
            hits = summary["connector_hit_tokens"][phase] if side == SIDES[1] else 0
            lines.append(
                f"{phase:<14} {side:<15} {ttft if ttft is not None else float('nan'):>18.0f} "
                f"{summary['tokens_per_second'][phase][side]:>9.1f} {hits:>14.0f}"
            )
    return "\n".join(lines)


def verdicts(summary: dict[str, Any]) -> list[str]:
    lines = []
    for phase, (key, target) in TARGETS.items():
        ratio = summary[key]
        passed = ratio is not None and ratio <= target
        lines.append(
            f"{'PASS' if passed else 'FAIL'}  {phase}: later turns' TTFT with the connector "
            f"{ratio} of vLLM alone (target <= {target})"
        )
    return lines


def plot(records: list[dict[str, Any]], title: str, out: Path) -> None:
    fig, axes = plt.subplots(1, len(PHASES), figsize=(11, 4), squeeze=False, constrained_layout=True)
    for axis, phase in zip(axes[0], PHASES, strict=True):
        for side in SIDES:
            turns = sorted({r["turn"] for r in records if r["phase"] == phase and r["side"] == side})
            medians = [
                statistics.median(
                    r["ttft_ms"]
                    for r in records
                    if r["phase"] == phase and r["side"] == side and r["turn"] == turn
                )
                for turn in turns
            ]
            axis.plot(turns, medians, marker="o", label=side)
            axis.set_xticks(turns)
        axis.set_title(phase)
        axis.set_xlabel("turn")
        axis.set_ylabel("median TTFT (ms)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    save_figure(fig, title, out)
