"""The benchmarks' figures. `plot` (daemon): grouped bars of GB/s per path for each chunk
size, one panel for reads (Get, GET, cold SSD reads) and one for writes (Put, SET), at
concurrency 1. `plot_ttft` (reuse): TTFT and speedup over recompute against history length.
`plot_load` (load): memory of each service, throughput and cached-turn TTFT over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from report import (
    GRPC,
    GRPC_CEILING,
    GRPC_VERIFY,
    MEMCPY,
    RAW,
    REDIS_AIO,
    REDIS_SYNC,
    SHM,
    SHM_BATCH,
    SHM_LEASED,
    SHM_VERIFY,
    SSD_TIER,
    Row,
)

_PANELS = {
    "Get / read": [
        ((MEMCPY, "copy"), "memcpy (yardstick)"), ((SHM, "get"), "daemon shm"),
        ((SHM_LEASED, "get"), "daemon shm, leased (1 round trip)"), ((SHM_VERIFY, "get"), "daemon shm +verify"), ((SHM_BATCH, "get"), "daemon shm, 4 keys/request"), ((GRPC, "get"), "daemon gRPC"),
        ((GRPC_VERIFY, "get"), "daemon gRPC +verify"), ((GRPC_CEILING, "get"), "bare grpcio stream (no store)"),
        ((REDIS_SYNC, "get"), "Redis GET (redis-py)"),
        ((REDIS_AIO, "get"), "Redis GET (asyncio)"), ((RAW, "read"), "raw direct read, cold"),
        ((SSD_TIER, "read"), "SSD tier read, cold"),
    ],
    "Put / write": [
        ((MEMCPY, "copy"), "memcpy (yardstick)"), ((SHM, "put"), "daemon shm"),
        ((GRPC, "put"), "daemon gRPC"), ((REDIS_SYNC, "set"), "Redis SET (redis-py)"),
        ((REDIS_AIO, "set"), "Redis SET (asyncio)"),
    ],
}


def plot(rows: list[Row], sizes: list[str], title: str, out: Path, concurrency: int = 1) -> None:
    by = {(r["path"], r["op"], r["size"]): r["gbps"] for r in rows if r["concurrency"] == concurrency}
    fig, axes = plt.subplots(2, 1, figsize=(12, 9), constrained_layout=True)
    palette = plt.get_cmap("tab10").colors
    paths = [MEMCPY, SHM, SHM_LEASED, SHM_VERIFY, SHM_BATCH, GRPC, GRPC_VERIFY, GRPC_CEILING, REDIS_SYNC, REDIS_AIO, RAW, SSD_TIER]
    colors = {path: palette[index % len(palette)] for index, path in enumerate(paths)}  # same in both panels
    for ax, (panel, series) in zip(axes, _PANELS.items(), strict=True):
        present = [(key, label) for key, label in series if any((*key, s) in by for s in sizes)]
        width = 0.8 / max(1, len(present))
        x = np.arange(len(sizes))
        for index, (key, label) in enumerate(present):
            values = [by.get((*key, size), 0.0) for size in sizes]
            bars = ax.bar(x + (index - (len(present) - 1) / 2) * width, values, width, label=label,
                          color=colors[key[0]])
            ax.bar_label(bars, fmt="%.2f", fontsize=7, rotation=90, padding=2)
        ax.set_xticks(x, [f"{size} chunk" for size in sizes])
        ax.set_ylabel("GB/s (higher is better)")
        ax.set_yscale("log")
        ax.set_title(f"{panel}, {concurrency} request in flight per client")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8, ncols=3, loc="upper left")
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * 8)  # room for the legend and the bar labels
    fig.suptitle(title, fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


Points = list[tuple[int, float]]  # (history tokens, value)


def plot_ttft(
    ttft: dict[str, Points], speedup: dict[str, Points], *, min_history_tokens: int, target: float,
    title: str, out: Path,
) -> None:
    """Left: TTFT per method against the turn's history length; right: recompute TTFT over
    the TTFT of each method in `speedup` (a subset of `ttft`'s), with the target and the
    long-history threshold drawn. A method keeps its color and marker in both panels."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5), constrained_layout=True)
    palette, markers = plt.get_cmap("tab10").colors, "os^vDPX*"
    style = {
        method: {"color": palette[index % len(palette)], "marker": markers[index % len(markers)]}
        for index, method in enumerate(ttft)
    }
    for ax, series, suffix in ((left, ttft, ""), (right, speedup, " vs recompute")):
        for method, points in series.items():
            x, y = zip(*points, strict=True) if points else ((), ())
            ax.scatter(x, y, label=method + suffix, s=22, alpha=0.8, **style[method])
    left.set_yscale("log")
    left.set_ylabel("TTFT, ms (lower is better)")
    left.set_title("time to first token per turn")
    right.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}x")
    right.set_ylabel("recompute TTFT / reuse TTFT (higher is better)")
    right.set_title("speedup over recomputing the whole prompt")
    for ax in (left, right):
        ax.axvline(min_history_tokens, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("history tokens before the turn (reusable prefix)")
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


LoadSeries = dict  # one run of the load benchmark: see plot_load


def plot_load(runs: list[LoadSeries], title: str, out: Path, bin_seconds: float = 5.0) -> None:
    """One column per run (N sessions): top, each service's private memory (solid) and RSS
    (dotted) over time; bottom, turns completed per second and the client TTFT of cached
    turns (p50, p99) per `bin_seconds`. The warm-up is shaded. A run is a dict with
    sessions, warmup_end, end, memory {service: [(seconds, private_mib, rss_mib)]} and
    turns [(ended_seconds, ttft_ms, cached)]."""
    fig, axes = plt.subplots(2, len(runs), figsize=(7 * len(runs), 8), constrained_layout=True, squeeze=False)
    palette = plt.get_cmap("tab10").colors
    for column, run in enumerate(runs):
        memory_ax, turns_ax = axes[0][column], axes[1][column]
        for index, (service, points) in enumerate(sorted(run["memory"].items())):
            seconds, private, rss = zip(*points, strict=True)
            memory_ax.plot(seconds, private, color=palette[index % len(palette)], label=f"{service} private")
            memory_ax.plot(seconds, rss, color=palette[index % len(palette)], linestyle=":", linewidth=1)
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
    fig.suptitle(title, fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
