"""What bench-pool prints and saves besides its summary: the table of every path, size and
reader count (GB/s, p50/p99), the issue's targets as PASS/FAIL lines, and the figure
(GB/s by readers per path, one panel per chunk size)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common.plot_style import plt, save_figure

TARGETS = (  # (summary key, at least, what)
    ("dataplane_get_vs_redis_get", 1.2, "data-plane Get vs Redis GET at every reader count (5.9 MB)"),
    ("dataplane_get_vs_socket_limit", 0.6, "data-plane Get vs the plain loopback socket (5.9 MB)"),
    ("dataplane_get_vs_lmcache", 1.0, "data-plane Get vs LMCache's server at every reader count (5.9 MB)"),
    ("dataplane_get_vs_mooncake_te", 1.0, "data-plane Get vs Mooncake's Transfer Engine over TCP (5.9 MB)"),
    (
        "dataplane_get_vs_mooncake_store",
        1.0,
        "data-plane Get vs Mooncake Store at every reader count (5.9 MB)",
    ),
)
POOLED_TARGETS = (  # (summary key, at least, what): the three-node replay's single numbers
    ("pooled_hit_rate_vs_whole_capacity", 0.9, "pooled hit rate vs one daemon with the pool's capacity"),
    ("pooled_hit_rate_vs_single_node", 1.2, "pooled hit rate vs the same nodes without a pool"),
)


def format_table(rows: list[dict[str, Any]]) -> str:
    header = f"{'path':<24}{'size':>7}{'readers':>8}{'GB/s':>8}{'p50 ms':>9}{'p99 ms':>9}"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['path']:<24}{row['size']:>7}{row['concurrency']:>8}{row['gbps']:>8.2f}"
            f"{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}"
        )
    return "\n".join(lines)


def verdicts(summary: dict[str, Any]) -> list[str]:
    lines = []
    for key, target, what in TARGETS:
        worst = summary[key].get("min")
        if worst is None:  # a path left out (--sizes, --no-lmcache) or a peer that could not run
            why = (
                f"{', '.join(summary['unavailable'])} unavailable"
                if summary.get("unavailable")
                else "not run"
            )
            lines.append(f"SKIP  {what}: not measured ({why})")
            continue
        passed = worst is not None and worst >= target
        lines.append(f"{'PASS' if passed else 'FAIL'}  {what}: {worst} at worst (target >= {target})")
    for key, target, what in POOLED_TARGETS:
        if key in summary:
            verdict = "PASS" if summary[key] >= target else "FAIL"
            lines.append(f"{verdict}  {what}: {summary[key]} (target >= {target})")
    if "later_turn_ttft_ms_p50" in summary:
        lines.append(f"note  the busy node's later-turn TTFT p50 / mean ms by layout (worker replay): "
                     f"{summary['later_turn_ttft_ms_p50']} / {summary['later_turn_ttft_ms_mean']}")  # fmt: skip
    by_size = summary["dataplane_get_vs_redis_get_every_size"]
    lines.append(f"note  data-plane Get vs Redis GET by chunk size (worst reader count): {by_size}")
    blocking = summary["dataplane_get_blocking_vs_redis_get_every_size"]
    lines.append(
        f"note  the blocking client's data-plane Get vs Redis GET by chunk size (worst reader count): {blocking}"
    )
    lines.append(
        f"note  the blocking client's data-plane Get vs LMCache: {summary['dataplane_get_blocking_vs_lmcache']}"
    )
    return lines


def plot(rows: list[dict[str, Any]], title: str, out: Path) -> None:
    sizes = list(dict.fromkeys(row["size"] for row in rows))
    fig, axes = plt.subplots(
        1, len(sizes), figsize=(4.2 * len(sizes), 4), squeeze=False, constrained_layout=True
    )
    for axis, size in zip(axes[0], sizes, strict=True):
        mine = [row for row in rows if row["size"] == size]
        for path in dict.fromkeys(row["path"] for row in mine):
            points = sorted((row["concurrency"], row["gbps"]) for row in mine if row["path"] == path)
            axis.plot([c for c, _ in points], [g for _, g in points], marker="o", label=path)
        axis.set_xscale("log", base=2)
        axis.set_xticks([1, 4, 16], ["1", "4", "16"])
        axis.set_title(f"{size} chunks")
        axis.set_xlabel("concurrent readers")
        axis.set_ylabel("GB/s")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=6)
    save_figure(fig, title, out)
