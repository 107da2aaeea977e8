"""The C linear over a few fp32 rows from packed panels (panel_linear.c) against `F.linear`:
with and without bias and residual, row counts that fill one and two register tiles, outputs
that fill and do not fill their last panel, widths that are and are not whole vectors, one
and two threads, the machine's build and one without AVX-512; a row gives the same bits alone
and batched; bad inputs refused; the model's linears (alone and fused) use it from 3 to
MAX_ROWS rows with the same bits; and the fallback to oneDNN when it is forced unavailable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from c_builds import C_BUILDS, assert_forced_unavailable, built_kernel
from linear_checks import check_against_f_linear

from inference_worker.cpu_linear import OneDnnLinear, _onednn_unavailable
from inference_worker.engine.panel_linear import (
    MAX_ROWS,
    MIN_ROWS,
    PANEL,
    SOURCE,
    UNAVAILABLE_VARIABLE,
    PanelLinear,
    load_panel_linear,
)
from inference_worker.model_store import load_model


@pytest.fixture(scope="module", params=C_BUILDS)  # the portable loop too
def kernel(request: pytest.FixtureRequest) -> PanelLinear:
    return built_kernel(request.param, SOURCE, PanelLinear, load_panel_linear)


@pytest.mark.parametrize("rows", [3, 14, 15, MAX_ROWS])  # 14: one tile of registers; 15: 8 + 7
@pytest.mark.parametrize(("width", "out"), [(576, 2 * PANEL), (40, 193)])  # 193: a padded last panel
@pytest.mark.parametrize("extras", ["none", "bias", "residual", "both"])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_f_linear(
    kernel: PanelLinear, rows: int, width: int, out: int, extras: str, threads: int
) -> None:
    def linear(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None
    ) -> torch.Tensor:
        return kernel(x, kernel.pack(weight), out, bias, residual)

    check_against_f_linear(linear, rows, width, out, extras, threads)


def test_a_row_gives_the_same_bits_alone_and_batched(kernel: PanelLinear) -> None:
    generator = torch.Generator().manual_seed(5)
    x, weight = torch.randn(16, 576, generator=generator), torch.randn(300, 576, generator=generator)
    panels = kernel.pack(weight)
    batched = kernel(x, panels, 300, None)
    for rows in (slice(0, 3), slice(3, 16), slice(5, 9)):
        assert torch.equal(batched[rows], kernel(x[rows], panels, 300, None))


def test_bad_inputs_are_refused(kernel: PanelLinear) -> None:
    panels = kernel.pack(torch.randn(8, 64))
    with pytest.raises(ValueError, match="rows"):
        kernel(torch.randn(MAX_ROWS + 1, 64), panels, 8, None)
    with pytest.raises(ValueError, match="rows"):
        kernel(torch.randn(3, 32), panels, 8, None)
    with pytest.raises(ValueError, match="panels"):
        kernel(torch.randn(3, 64), panels, 40, None)
    with pytest.raises(ValueError, match="bias"):
        kernel(torch.randn(3, 64), panels, 8, torch.randn(7))
    with pytest.raises(ValueError, match="residual"):
        kernel(torch.randn(3, 64), panels, 8, None, torch.randn(3, 9))


def test_runs_only_fp32_cpu_rows_from_min_to_max_rows() -> None:
    weight = torch.randn(8, 64)
    assert PanelLinear.runs(torch.randn(MIN_ROWS, 64), weight)
    assert PanelLinear.runs(torch.randn(MAX_ROWS, 64), weight)
    assert not PanelLinear.runs(torch.randn(MIN_ROWS - 1, 64), weight)
    assert not PanelLinear.runs(torch.randn(MAX_ROWS + 1, 64), weight)
    assert not PanelLinear.runs(torch.randn(4, 64).bfloat16(), weight.bfloat16())
    assert not PanelLinear.runs(torch.randn(64, 4).t(), weight)  # four rows, not contiguous


def test_forced_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_forced_unavailable(monkeypatch, load_panel_linear, UNAVAILABLE_VARIABLE, "onednn")


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: q, k, v with biases
def test_the_models_linears_use_it_from_min_to_max_rows(
    tiny_model_dir: Callable[..., Path], family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MIN_ROWS to MAX_ROWS rows go through the kernel, alone and fused, with the same bits
    either way; forward and the residual add agree with F.linear; more rows run oneDNN."""
    model = load_model(tiny_model_dir(family), torch.float32, "cpu").model
    if _onednn_unavailable(torch.float32) is not None:
        pytest.skip("oneDNN's fp32 inner product is unavailable on this CPU: the linears stay nn.Linear")
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.q_proj, OneDnnLinear) and attn.q_proj.panels is not None
    calls: list[int] = []
    original = PanelLinear.__call__

    def counted(self: PanelLinear, x: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return original(self, x, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(PanelLinear, "__call__", counted)
    generator = torch.Generator().manual_seed(6)
    linears = (attn.q_proj, attn.k_proj, attn.v_proj)
    with torch.no_grad():
        for rows in (MIN_ROWS, MAX_ROWS, MAX_ROWS + 1):
            x = torch.randn(rows, attn.q_proj.in_features, generator=generator)
            for got, linear in zip(attn.fused_qkv(x), linears, strict=True):
                want = F.linear(x, linear.weight, linear.bias)
                assert torch.equal(got, linear(x))
                assert (got - want).abs().max() <= 1e-5 * want.abs().max()
            residual = torch.randn(rows, attn.q_proj.out_features, generator=generator)
            want = F.linear(x, attn.q_proj.weight, attn.q_proj.bias) + residual
            assert (attn.q_proj.plus(x, residual) - want).abs().max() <= 1e-5 * want.abs().max()
    assert calls == [MIN_ROWS] * 5 + [MAX_ROWS] * 5
