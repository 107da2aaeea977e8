"""Linear layers over a few fp32 rows on a CPU in C (panel_linear.c): a 16-sequence decode
step's projections and lm_head, a short prefill chunk's (a doc-QA question after its
document), from 3 rows (below, row_linear.py) to MAX_ROWS. Each weight is read from a copy
packed in panels of PANEL output columns (`pack`, once at load). Loaded like the decode
kernel (c_build.py), probed against `F.linear`; where it does not build, load or agree, the
model's linears keep oneDNN (cpu_linear.py). `ATTNSTORE_PANEL_LINEAR_UNAVAILABLE=1` forces that.

Why, measured on the development machine (SmolLM2-135M's 30 layers of q/k/v, o, gate/up and
down, 424 MB of distinct weights read from DRAM, one thread, CPU time, oneDNN and this kernel
alternated, second best of 6-7; load 5.6-7.6): 4 rows 35.3 -> 22.1 ms, 8 rows 38.0 -> 25.1,
14 rows 46.0 -> 35.7, 16 rows 47.1 -> 39.8, 32 rows 85.0 -> 73.2; 48 even, so oneDNN keeps
more than 32 (docs/inference-worker.md, seventeenth pass). The price: the panels are a third
copy of the weights (RSS after loading SmolLM2-135M fp32 1,742 -> 2,333 MB).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from inference_worker.engine.row_linear import MAX_ROWS as ROW_LINEAR_MAX_ROWS
from inference_worker.engine.row_linear import CLinear, disagreement
from inference_worker.kernels import KernelChoice, load_choice

SOURCE = Path(__file__).with_name("panel_linear.c")
UNAVAILABLE_VARIABLE = "ATTNSTORE_PANEL_LINEAR_UNAVAILABLE"
PANEL = 32  # panel_linear.c's PANEL: output columns per panel
MIN_ROWS = ROW_LINEAR_MAX_ROWS + 1  # fewer rows run row_linear.c, which reads the plain weight
MAX_ROWS = 32  # panel_linear.c's MAX_ROWS; more rows run oneDNN's packed GEMM (compute-bound there)


class PanelLinear:
    def __init__(self, library: ctypes.CDLL) -> None:
        self._linear = CLinear(library, "linear_panels_f32")

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        """weight [out, in] as panels [ceil(out / PANEL), in, PANEL], the last padded with zeros."""
        out, width = weight.shape
        panels = -(-out // PANEL)
        padded = weight.detach().new_zeros(panels * PANEL, width)
        padded[:out] = weight.detach()
        return padded.view(panels, PANEL, width).transpose(1, 2).contiguous()

    @staticmethod
    def runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether it computes `x @ weight.T` for these rows: MIN_ROWS to MAX_ROWS fp32 CPU
        rows, contiguous."""
        return (
            x.dtype == weight.dtype == torch.float32
            and x.device.type == weight.device.type == "cpu"
            and MIN_ROWS * x.shape[-1] <= x.numel() <= MAX_ROWS * x.shape[-1]
            and x.is_contiguous()
        )

    def __call__(
        self,
        x: torch.Tensor,
        panels: torch.Tensor,
        out: int,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [.., in] @ weight [out, in].T (+ bias [out]) (+ residual [.., out]), the weight
        given as `pack(weight)`; 1 to MAX_ROWS rows (`runs` says where it is the fastest)."""
        width = panels.shape[1]
        if panels.shape != (-(-out // PANEL), width, PANEL) or not panels.is_contiguous():
            raise ValueError(f"panels must be pack() of a [{out}, {width}] weight, not {list(panels.shape)}")
        return self._linear(panels, x, out, width, bias, residual, MAX_ROWS)


@functools.cache
def load_panel_linear() -> tuple[PanelLinear | None, KernelChoice]:
    """The kernel, or None and why not (once per process)."""
    chosen = KernelChoice("panel-linear-c", f"{MIN_ROWS} to {MAX_ROWS} rows in C over packed panels")
    otherwise = f"oneDNN from {MIN_ROWS} rows"
    return load_choice(
        SOURCE, UNAVAILABLE_VARIABLE, PanelLinear, _probe, chosen, otherwise, fallback="onednn"
    )


def _probe(kernel: PanelLinear) -> str | None:
    """Why the kernel disagrees with F.linear on small cases, or None."""

    def linear(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor
    ) -> torch.Tensor:
        return kernel(x, kernel.pack(weight), weight.shape[0], bias, residual)

    # 40 outputs: a padded panel; 15 rows: two tiles of registers; 40 inputs: not whole vectors
    return disagreement(linear, ((3, 64, 40), (15, 40, 24), (MAX_ROWS, 64, 72)))
