"""The load benchmark's figure: memory of each service, throughput and cached-turn TTFT
over time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.common.plot_style import PALETTE, plt, save_figure

LoadSeries = dict  # one run of the load benchmark: see plot_load


def plot_load(runs: list[LoadSeries], title: str, out: Path, bin_seconds: float = 5.0) -> None:
    """One column per run (N sessions): top, each service's private memory (solid) and RSS
    (dotted) over time; bottom, turns completed per second and the client TTFT of cached
    turns (p50, p99) per `bin_seconds`. The warm-up is shaded. A run is a dict with
    sessions, warmup_end, end, memory {service: [(seconds, private_mib, rss_mib)]} and
    turns [(ended_seconds, ttft_ms, cached)]."""
    fig, axes = plt.subplots(2, len(runs), figsize=(7 * len(runs), 8), constrained_layout=True, squeeze=False)
    for column, run in enumerate(runs):
        memory_ax, turns_ax = axes[0][column], axes[1][column]
        for index, (service, points) in enumerate(sorted(run["memory"].items())):
            seconds, private, rss = zip(*points, strict=True)
            memory_ax.plot(seconds, private, color=PALETTE[index % len(PALETTE)], label=f"{service} private")
            memory_ax.plot(seconds, rss, color=PALETTE[index % len(PALETTE)], linestyle=":", linewidth=1)
        memory_ax.set_ylabel("MiB (solid: private, dotted: RSS)")
        memory_ax.set_title(f"N = {run['sessions']} sessions: memory of each service")
        memory_ax.legend(fontsize=7, ncols=2)
        edges = np.arange(0, run["end"] + 1e-9, bin_seconds)  # whole bins up to the deadline
        ended = np.array([t[0] for t in run["turns"]])
        counts, _ = np.histogram(ended, bins=edges)
        centers = edges[:-1] + bin_seconds / 2
        turns_ax.step(centers, counts / bin_seconds, where="mid", color="black", label="turns/s")
        turns_ax.set_ylabel("turns completed per second")
        ttft_ax = turns_ax.twinx()
        for q, style in ((50, "-"), (99, "--")):
            values = [
                np.percentile(cached, q) if (cached := [t[1] for t in run["turns"]
                                                        if t[2] and lo <= t[0] < lo + bin_seconds]) else np.nan
                for lo in edges[:-1]
            ]  # fmt: skip
            ttft_ax.plot(centers, values, linestyle=style, color="tab:red", label=f"cached-turn TTFT p{q}")
        ttft_ax.set_ylabel("client TTFT of cached turns, ms", color="tab:red")
        ttft_ax.legend(fontsize=7, loc="lower right")
        turns_ax.set_title("throughput and cached-turn TTFT")
        for ax in (memory_ax, turns_ax):
            ax.axvspan(0, run["warmup_end"], color="grey", alpha=0.15)
            ax.set_xlabel("seconds (shaded: warm-up)")
            ax.grid(alpha=0.3)
    save_figure(fig, title, out)
