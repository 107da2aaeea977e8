"""The reuse benchmark's figure: TTFT and speedup over recompute against history length."""

from __future__ import annotations

from pathlib import Path

from bench.common.plot_style import PALETTE, finish_axes, plt, save_figure

Points = list[tuple[int, float]]  # (history tokens, value)


def plot_ttft(
    ttft: dict[str, Points],
    speedup: dict[str, Points],
    *,
    min_history_tokens: int,
    target: float,
    title: str,
    out: Path,
) -> None:
    """Left: TTFT per method against the turn's history length; right: recompute TTFT over
    the TTFT of each method in `speedup` (a subset of `ttft`'s), with the target and the
    long-history threshold drawn. A method keeps its color and marker in both panels."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5), constrained_layout=True)
    markers = "os^vDPX*"
    style = {
        method: {"color": PALETTE[index % len(PALETTE)], "marker": markers[index % len(markers)]}
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
        finish_axes(ax, "history tokens before the turn (reusable prefix)")
    save_figure(fig, title, out)
