"""The check the C linears' tests share (row_linear.c, panel_linear.c): a kernel's
`x @ weight.T (+ bias) (+ residual)` against `F.linear` in float64, at a thread count."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# (x, weight, bias, residual) -> the kernel's output
Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor]


def check_against_f_linear(
    linear: Linear, rows: int, width: int, out: int, extras: str, threads: int
) -> None:
    """`extras`: "none", "bias", "residual" or "both"; within 1e-5 of the largest output."""
    generator = torch.Generator().manual_seed(rows * 1000 + width)
    x, weight = torch.randn(rows, width, generator=generator), torch.randn(out, width, generator=generator)
    bias = torch.randn(out, generator=generator) if extras in ("bias", "both") else None
    residual = torch.randn(rows, out, generator=generator) if extras in ("residual", "both") else None
    want = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    if residual is not None:
        want = want + residual.double()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = linear(x, weight, bias, residual)
    finally:
        torch.set_num_threads(previous)
    assert got.shape == (rows, out) and got.dtype == torch.float32
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
