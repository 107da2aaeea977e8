"""The C linear over one or two fp32 rows (row_linear.c) against `F.linear`: with and without
bias and residual, widths that are and are not whole 16-float vectors, one and two threads,
the machine's build and one without AVX-512; a row gives the same bits alone and beside
another; bad inputs refused; the model's linears use it at one and two rows only; and the
fallback to oneDNN when it is forced unavailable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from c_builds import C_BUILDS, built_kernel
from linear_checks import check_against_f_linear

from inference_worker.cpu_linear import OneDnnLinear, _onednn_unavailable
from inference_worker.engine.row_linear import (
    MAX_ROWS,
    SOURCE,
    UNAVAILABLE_VARIABLE,
    RowLinear,
    load_row_linear,
)
from inference_worker.model_store import load_model


@pytest.fixture(scope="module", params=C_BUILDS)  # the portable loop too
def kernel(request: pytest.FixtureRequest) -> RowLinear:
    return built_kernel(request.param, SOURCE, RowLinear, load_row_linear)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("width", [576, 40])  # 40: not a whole number of 16-float vectors
@pytest.mark.parametrize("extras", ["none", "bias", "residual", "both"])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_f_linear(kernel: RowLinear, rows: int, width: int, extras: str, threads: int) -> None:
    check_against_f_linear(kernel, rows, width, 193, extras, threads)


def test_a_row_gives_the_same_bits_alone_and_batched(kernel: RowLinear) -> None:
    generator = torch.Generator().manual_seed(5)
    x, weight = torch.randn(2, 576, generator=generator), torch.randn(300, 576, generator=generator)
    both = kernel(x, weight, None)
    assert torch.equal(both[0], kernel(x[:1], weight, None)[0])
    assert torch.equal(both[1], kernel(x[1:], weight, None)[0])


def test_leading_dimensions_are_kept(kernel: RowLinear) -> None:
    x, weight = torch.randn(1, 2, 64), torch.randn(8, 64)
    assert kernel(x, weight, None, torch.zeros(1, 2, 8)).shape == (1, 2, 8)


def test_bad_inputs_are_refused(kernel: RowLinear) -> None:
    weight = torch.randn(8, 64)
    with pytest.raises(ValueError, match="rows"):
        kernel(torch.randn(MAX_ROWS + 1, 64), weight, None)
    with pytest.raises(ValueError, match="rows"):
        kernel(torch.randn(1, 32), weight, None)
    with pytest.raises(ValueError, match="bias"):
        kernel(torch.randn(1, 64), weight, torch.randn(7))
    with pytest.raises(ValueError, match="residual"):
        kernel(torch.randn(1, 64), weight, None, torch.randn(1, 9))


def test_runs_only_fp32_cpu_rows_up_to_max_rows() -> None:
    weight = torch.randn(8, 64)
    assert RowLinear.runs(torch.randn(MAX_ROWS, 64), weight)
    assert not RowLinear.runs(torch.randn(MAX_ROWS + 1, 64), weight)
    assert not RowLinear.runs(torch.randn(0, 64), weight)
    assert not RowLinear.runs(torch.randn(1, 64).bfloat16(), weight.bfloat16())
    assert not RowLinear.runs(torch.randn(64, 2).t(), weight)  # two rows, not contiguous


def test_forced_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNAVAILABLE_VARIABLE, "1")
    loaded, choice = load_row_linear.__wrapped__()
    assert loaded is None and UNAVAILABLE_VARIABLE in choice.reason and choice.kernel == "onednn"


def test_the_models_linears_use_it_for_one_and_two_rows(
    tiny_model_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One and two rows go through the kernel, more through oneDNN; forward and the residual
    add agree with F.linear either way."""
    model = load_model(tiny_model_dir("qwen2"), torch.float32, "cpu").model  # q_proj has a bias
    if _onednn_unavailable(torch.float32) is not None:
        pytest.skip("oneDNN's fp32 inner product is unavailable on this CPU: the linears stay nn.Linear")
    q_proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, OneDnnLinear) and q_proj.row_linear is not None
    calls: list[int] = []
    original = RowLinear.__call__

    def counted(self: RowLinear, x: torch.Tensor, *args: torch.Tensor | None) -> torch.Tensor:
        calls.append(x.shape[0])
        return original(self, x, *args)

    monkeypatch.setattr(RowLinear, "__call__", counted)
    generator = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for rows in (1, 2, 3):
            x = torch.randn(rows, q_proj.in_features, generator=generator)
            residual = torch.randn(rows, q_proj.out_features, generator=generator)
            want = F.linear(x, q_proj.weight, q_proj.bias)
            assert (q_proj(x) - want).abs().max() <= 1e-5
            assert (q_proj.plus(x, residual) - (want + residual)).abs().max() <= 1e-5
    assert calls == [1, 1, 2, 2]
