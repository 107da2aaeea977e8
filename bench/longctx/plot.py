"""The long-context benchmark's figure: split-and-merge overhead, a decode step's bytes and
time with remote micro-attention vs pulling the KV, and the remote share of blocks with
and without DGFM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common.plot_style import PALETTE, finish_axes, plt, save_figure

SPLIT_PATHS = {
    "places": "a partial per place",
    "per_block": "a partial per block",
    "one_call": "blocks in one call",
}


def plot_longctx(document: dict[str, Any], target_overhead: float, out: Path) -> None:
    fig, (split, moved, dgfm) = plt.subplots(1, 3, figsize=(16, 5), constrained_layout=True)
    rows = list(document["split"])
    width = 0.8 / len(SPLIT_PATHS)
    for index, (path, label) in enumerate(SPLIT_PATHS.items()):
        points = [(x, row[f"{path}_overhead"] * 100) for x, row in enumerate(document["split"].values())
                  if f"{path}_overhead" in row]  # fmt: skip
        split.bar([x + index * width for x, _ in points], [y for _, y in points], width,
                  color=PALETTE[index], label=label)  # fmt: skip
    split.axhline(target_overhead * 100, color="grey", linestyle="--", linewidth=1, label="target")
    split.set_xticks([x + width for x in range(len(rows))], rows, fontsize=8)
    split.set_title("split-and-merge vs monolithic attention, 16k keys")
    finish_axes(split, "queries and block size", "overhead, % (lower is better)")
    sizes = list(document["decode"])
    for index, mode in enumerate(("remote", "pull")):
        rows_of = [document["decode"][size][mode] for size in sizes]
        moved.plot(sizes, [r["bytes_per_step"] for r in rows_of], marker="o", color=PALETTE[index],
                   label=f"{mode}: bytes")  # fmt: skip
        moved.plot(sizes, [r["step_ms"] * 1e3 for r in rows_of], marker="s", linestyle="--",
                   color=PALETTE[index], label=f"{mode}: step time, µs")  # fmt: skip
    moved.set_title("decode step with remote KV")
    finish_axes(moved, "remote tokens", "bytes moved per step / step time in µs", log_y=True)
    periods = range(1, len(document["dgfm"]["without"]) + 1)
    for index, key in enumerate(("without", "with")):
        dgfm.plot(periods, document["dgfm"][key], marker="o", color=PALETTE[index], label=f"{key} DGFM")
    dgfm.axhline(document["dgfm"]["forced"], color="grey", linestyle=":", linewidth=1, label="forced floor")
    dgfm.set_xticks(list(periods))
    dgfm.set_title("remote share of blocks (drift simulation)")
    finish_axes(dgfm, "period", "share of blocks away from home")
    save_figure(fig, "DistAttention on long contexts (make bench-longctx)", out)
