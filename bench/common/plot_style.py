"""What every benchmark figure shares: a headless backend, one palette, and the title,
resolution and saving done the same way."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

PALETTE = plt.get_cmap("tab10").colors
DPI = 110


def save_figure(fig: Figure, title: str, out: Path) -> None:
    """Titles `fig`, writes it to `out` (folders made as needed) and frees it."""
    fig.suptitle(title, fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


def finish_axes(ax: Axes, xlabel: str, ylabel: str | None = None, *, log_y: bool = False) -> None:
    """The axis labels, a log y axis where asked, the grid and the legend."""
    ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8)
