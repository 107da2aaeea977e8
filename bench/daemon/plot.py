"""The daemon benchmark's figure: grouped bars of GB/s per path for each chunk size, one
panel for reads (Get, GET, cold SSD reads) and one for writes (Put, SET), at concurrency 1."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.common.plot_style import PALETTE, plt, save_figure
from bench.daemon import report as P  # the path names
from bench.daemon.report import Row

_PANELS = {
    "Get / read": [
        ((P.MEMCPY, "copy"), "memcpy (yardstick)"),
        ((P.SHM, "get"), "daemon shm"),
        ((P.SHM_LEASED, "get"), "daemon shm, leased (1 round trip)"),
        ((P.SHM_VERIFY, "get"), "daemon shm +verify"),
        ((P.SHM_BATCH, "get"), "daemon shm, 4 keys/request"),
        ((P.GRPC, "get"), "daemon gRPC"),
        ((P.GRPC_VERIFY, "get"), "daemon gRPC +verify"),
        ((P.GRPC_CEILING, "get"), "bare grpcio stream (no store)"),
        ((P.REDIS_SYNC, "get"), "Redis GET (redis-py)"),
        ((P.REDIS_AIO, "get"), "Redis GET (asyncio)"),
        ((P.RAW, "read"), "raw direct read, cold"),
        ((P.SSD_TIER, "read"), "SSD tier read, cold"),
    ],
    "Put / write": [
        ((P.MEMCPY, "copy"), "memcpy (yardstick)"),
        ((P.SHM, "put"), "daemon shm"),
        ((P.GRPC, "put"), "daemon gRPC"),
        ((P.REDIS_SYNC, "set"), "Redis SET (redis-py)"),
        ((P.REDIS_AIO, "set"), "Redis SET (asyncio)"),
    ],
}


def plot(rows: list[Row], sizes: list[str], title: str, out: Path, concurrency: int = 1) -> None:
    by = {(r["path"], r["op"], r["size"]): r["gbps"] for r in rows if r["concurrency"] == concurrency}
    fig, axes = plt.subplots(2, 1, figsize=(12, 9), constrained_layout=True)
    paths = [
        P.MEMCPY,
        P.SHM,
        P.SHM_LEASED,
        P.SHM_VERIFY,
        P.SHM_BATCH,
        P.GRPC,
        P.GRPC_VERIFY,
        P.GRPC_CEILING,
        P.REDIS_SYNC,
        P.REDIS_AIO,
        P.RAW,
        P.SSD_TIER,
    ]
    colors = {path: PALETTE[index % len(PALETTE)] for index, path in enumerate(paths)}  # same in both panels
    for ax, (panel, series) in zip(axes, _PANELS.items(), strict=True):
        present = [(key, label) for key, label in series if any((*key, s) in by for s in sizes)]
        width = 0.8 / max(1, len(present))
        x = np.arange(len(sizes))
        for index, (key, label) in enumerate(present):
            values = [by.get((*key, size), 0.0) for size in sizes]
            bars = ax.bar(
                x + (index - (len(present) - 1) / 2) * width, values, width, label=label, color=colors[key[0]]
            )
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
