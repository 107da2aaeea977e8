"""The daemon benchmark's figure: grouped bars of GB/s per path for each chunk size, one
panel for reads (Get, GET, cold SSD reads) and one for writes (Put, SET), at concurrency 1."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.common.plot_style import PALETTE, plt, save_figure
from bench.daemon.report import (
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
    paths = [MEMCPY, SHM, SHM_LEASED, SHM_VERIFY, SHM_BATCH, GRPC, GRPC_VERIFY, GRPC_CEILING, REDIS_SYNC, REDIS_AIO, RAW, SSD_TIER]
    colors = {path: PALETTE[index % len(PALETTE)] for index, path in enumerate(paths)}  # same in both panels
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
    save_figure(fig, title, out)
