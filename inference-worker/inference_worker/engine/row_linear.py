"""Linear layers over one or two fp32 rows on a CPU in C (row_linear.c): a decode step's
projections and lm_head, which only stream their weights. Loaded like the decode kernel
(c_build.py), probed against `F.linear`; where it does not build, load or agree, the model's
linears keep oneDNN (cpu_linear.py). `ATTNSTORE_ROW_LINEAR_UNAVAILABLE=1` forces that.

Why, measured on the development machine (SmolLM2-135M's 121 decode-step weights, 538 MB,
cycled so that none sits in cache, one thread, old and new alternated, min of 11; load 7):
one row 76.2 -> 31.3 ms, two rows 82.4 -> 37.7 ms (oneDNN's matrix-vector kernel and its
packed GEMM at two rows read ~7-13 GB/s, this loop what a plain `sum` over the same bytes
reads); three rows even (67.0 vs 66.6), four slower in C (39.3 vs 30.1): from three rows on
oneDNN's packed GEMM keeps them."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

from inference_worker.kernels import KernelChoice, load_choice

SOURCE = Path(__file__).with_name("row_linear.c")
UNAVAILABLE_VARIABLE = "ATTNSTORE_ROW_LINEAR_UNAVAILABLE"
MAX_ROWS = 2  # row_linear.c's MAX_ROWS; more rows run oneDNN's packed GEMM (measured above)
_PROBE_TOLERANCE = 1e-5  # relative: fp32 dot products in another order, far below a wrong build's
_c_ptr = ctypes.c_void_p


class RowLinear:
    def __init__(self, library: ctypes.CDLL) -> None:
        self._linear = CLinear(library, "linear_rows_f32")

    @staticmethod
    def runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether it computes `x @ weight.T`: 1 to MAX_ROWS fp32 CPU rows, contiguous."""
        return (
            x.dtype == weight.dtype == torch.float32
            and x.device.type == weight.device.type == "cpu"
            and 0 < x.numel() <= MAX_ROWS * x.shape[-1]
            and x.is_contiguous()
            and weight.is_contiguous()
        )

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [.., in] @ weight [out, in].T (+ bias [out]) (+ residual [.., out]), for `runs` inputs."""
        out, width = weight.shape
        return self._linear(weight, x, out, width, bias, residual, MAX_ROWS)


class CLinear:
    """One of the C linears (row_linear.c, panel_linear.c), which share a signature:
    (weight, x, bias, residual, y, rows, out, in, threads) -> 0, or 1 for rows out of range."""

    def __init__(self, library: ctypes.CDLL, name: str) -> None:
        self._function = getattr(library, name)
        self._function.argtypes = [_c_ptr] * 5 + [ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
        self._function.restype = ctypes.c_int

    def __call__(
        self,
        weight: torch.Tensor,
        x: torch.Tensor,
        out: int,
        width: int,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        max_rows: int,
    ) -> torch.Tensor:
        """y [.., out] from x [.., width] and the weight in the kernel's layout; ValueError when
        x has not 1 to `max_rows` rows or bias [out] / residual [.., out] do not fit."""
        rows = x.numel() // width if width else 0
        if x.shape[-1] != width or not 1 <= rows <= max_rows:
            raise ValueError(f"takes 1 to {max_rows} rows of {width}, not {list(x.shape)}")
        for name, extra, shape in (("bias", bias, (out,)), ("residual", residual, (*x.shape[:-1], out))):
            if extra is not None and (
                extra.shape != shape or extra.dtype != x.dtype or not extra.is_contiguous()
            ):
                raise ValueError(f"{name} must be contiguous {x.dtype} {list(shape)}")
        y = torch.empty((*x.shape[:-1], out), dtype=x.dtype)
        self._function(
            weight.data_ptr(), x.data_ptr(), None if bias is None else bias.data_ptr(),
            None if residual is None else residual.data_ptr(), y.data_ptr(), rows, out, width,
            torch.get_num_threads(),
        )  # fmt: skip
        return y


@functools.cache
def load_row_linear() -> tuple[RowLinear | None, KernelChoice]:
    """The kernel, or None and why not (once per process)."""
    chosen = KernelChoice("row-linear-c", f"up to {MAX_ROWS} rows in C, reading each weight once")
    otherwise = "oneDNN at every row count"
    return load_choice(SOURCE, UNAVAILABLE_VARIABLE, RowLinear, _probe, chosen, otherwise, fallback="onednn")


def _probe(kernel: RowLinear) -> str | None:
    """Why the kernel disagrees with F.linear on small cases, or None."""
    return disagreement(kernel, ((1, 64, 24), (2, 64, 24), (2, 40, 24)))  # 40: not whole 16-float vectors


def disagreement(
    linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    cases: Iterable[tuple[int, int, int]],
) -> str | None:
    """Why `linear(x, weight, bias, residual)` disagrees with F.linear + residual at some
    (rows, in, out) of `cases`, or None."""
    generator = torch.Generator().manual_seed(0)
    for rows, width, out in cases:
        x, weight = (
            torch.randn(rows, width, generator=generator),
            torch.randn(out, width, generator=generator),
        )
        bias, residual = torch.randn(out, generator=generator), torch.randn(rows, out, generator=generator)
        want = F.linear(x, weight, bias) + residual
        error = float((linear(x, weight, bias, residual) - want).abs().max() / want.abs().max())
        if not error <= _PROBE_TOLERANCE:
            return f"disagrees with F.linear at {rows} rows of {width} (relative error {error:.3g})"
    return None
