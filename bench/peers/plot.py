"""The peers benchmark's figures: peers_store.png (GB/s of the daemon's paths and LMCache's
server, per op, chunk size and concurrency) and peers_serving.png (TTFT per turn, every
conversation as a dot and the median as a line, vLLM vs attnstore, one panel per phase)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.common.plot_style import PALETTE, finish_axes, plt, save_figure
from bench.daemon.report import GRPC, SHM, SHM_LEASED, Row
from bench.peers.report import ATTNSTORE, FITS, LMCACHE, OVER, VLLM, Record, serving_medians

STORE_PATHS = {
    SHM: "attnstore daemon, shared memory (re-read, lease-free)",
    SHM_LEASED: "attnstore daemon, shared memory, leased",
    GRPC: "attnstore daemon, gRPC",
    LMCACHE: "LMCache server, TCP",
}
SIDE_COLORS = {VLLM: "tab:orange", ATTNSTORE: "tab:blue"}


def plot_store(rows: list[Row], title: str, out: Path) -> None:
    cells = sorted(
        {(r["size"], r["concurrency"]) for r in rows}, key=lambda k: (k[1], float(k[0].rstrip("MB")))
    )
    by = {(r["path"], r["op"], r["size"], r["concurrency"]): r["gbps"] for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    x = np.arange(len(cells))
    width = 0.8 / len(STORE_PATHS)
    for ax, op in zip(axes, ("get", "put"), strict=True):
        for index, (path, label) in enumerate(STORE_PATHS.items()):
            values = [by.get((path, op, size, c), 0.0) for size, c in cells]
            bars = ax.bar(
                x + (index - (len(STORE_PATHS) - 1) / 2) * width,
                values,
                width,
                label=label,
                color=PALETTE[index],
            )
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
        ax.set_xticks(x, [f"{size} chunk\n{c} client{'s' if c > 1 else ''}" for size, c in cells])
        ax.set_ylabel("GB/s (higher is better)")
        ax.set_title(f"{op.capitalize()} (one request in flight per client)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, title, out)


def plot_serving(records: list[Record], title: str, out: Path) -> None:
    phases = [phase for phase in (FITS, OVER) if any(r["phase"] == phase for r in records)]
    medians = serving_medians(records)
    fig, axes = plt.subplots(
        1, len(phases), figsize=(7 * len(phases), 5), constrained_layout=True, squeeze=False
    )
    for ax, phase in zip(axes[0], phases, strict=True):
        for offset, side in ((-0.08, VLLM), (0.08, ATTNSTORE)):
            mine = [r for r in records if r["phase"] == phase and r["side"] == side]
            if not mine:
                continue
            ax.scatter(
                [r["turn"] + offset for r in mine],
                [r["ttft_ms"] for r in mine],
                s=12,
                alpha=0.4,
                color=SIDE_COLORS[side],
            )
            turns = sorted({r["turn"] for r in mine})
            ax.plot(
                turns,
                [medians[(phase, side, t)]["ttft_ms"] for t in turns],
                marker="o",
                color=SIDE_COLORS[side],
                label=f"{side} (median)",
            )
        ax.set_xticks(sorted({r["turn"] for r in records if r["phase"] == phase}))
        conversations = len({r["dialogue"] for r in records if r["phase"] == phase})
        ax.set_title(f"{phase}: {conversations} conversations, round-robin")
        finish_axes(
            ax, "turn of the conversation", "TTFT seen by the client, ms (lower is better)", log_y=True
        )
    save_figure(fig, title, out)
