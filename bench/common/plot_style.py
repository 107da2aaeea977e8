"""What every benchmark figure shares: a headless backend, one palette, and the title,
resolution and saving done the same way."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

PALETTE = plt.get_cmap("tab10").colors
DPI = 110


def save_figure(fig: Figure, title: str, out: Path) -> None:
    """Titles `fig`, writes it to `out` (folders made as needed) and frees it."""
    fig.suptitle(title, fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
