"""The model's linear layers on a CPU through oneDNN instead of torch's default GEMM.

Why: torch's fp32 `F.linear` on a CPU calls MKL's sgemm, which on the AMD EPYC development
machine ran a SmolLM2-sized projection (642 x 576 by 576 x 1536) at 190-213 GFLOPS, while
oneDNN, which torch also ships (`torch.ops.mkldnn._linear_pointwise`, the kernel Inductor
uses), ran it at 484-507 GFLOPS with the same fp32 accuracy. A whole SmolLM2-135M prefill
of 642 tokens went from 904 to 581 ms, a decode step from 36 to 25 ms. vLLM's CPU backend
routes its linear layers through oneDNN for the same reason.

The op is private to torch, so it is probed once at load time against `F.linear` and the
model keeps torch's default where it is missing or disagrees: on a CPU without AVX-512
(no `avx512_bf16`), oneDNN has no bf16 inner product and bf16 models keep torch's kernel.
`ATTNSTORE_ONEDNN_UNAVAILABLE=1` makes the probe answer "unavailable" on any machine, so
tests run that fallback everywhere.

oneDNN compiles a kernel per input shape and caches it (oneDNN's primitive cache and
torch's ideep cache, 1024 entries each by default). A worker sees a new token count with
nearly every prompt, and there the caches grew a worker's memory by ~670 MB before
levelling off; capped at 16 entries each (unless the environment sets them), memory stays
flat and prefill is as fast: compiling a kernel costs far less than the GEMM it runs.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Literal

import structlog
import torch
from torch import nn

from inference_worker import huge_pages
from inference_worker.engine.panel_linear import PANEL, PanelLinear, load_panel_linear
from inference_worker.engine.row_linear import RowLinear, load_row_linear
from inference_worker.kernels import KernelChoice

log = structlog.get_logger("inference_worker.cpu_linear")

CpuLinear = Literal["onednn", "torch"]
# A relative error far above fp32 (and bf16) rounding, far below a wrong kernel's.
_PROBE_RELATIVE_TOLERANCE = 0.05
# Read when oneDNN first runs, so set before the probe.
_KERNEL_CACHE_CAPACITY = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16", "LRU_CACHE_CAPACITY": "16"}
UNAVAILABLE_VARIABLE = "ATTNSTORE_ONEDNN_UNAVAILABLE"


class OneDnnLinear(nn.Linear):
    """nn.Linear whose forward is oneDNN's; parameters (and weight tying) are untouched.

    From two rows on, oneDNN reads a copy of the weight packed once in its blocked layout
    (packed by `use_onednn_linears` for the layers the engine runs alone, o, down and
    lm_head, so that no step pays for it; on the first such call for the others, which the
    engine runs fused (`FusedProjection`) and transformers' own forward alone). Inference
    only: the copy does not follow later changes to the weight. One or two fp32 rows (a
    decode step's) run `row_linear` where it loaded, 3 to 32 (a 16-sequence decode step's,
    a short chunk's) `panel_linear` over `panels`."""

    packed: torch.Tensor | None = None  # the weight in oneDNN's layout (an mkldnn tensor)
    row_linear: RowLinear | None = None  # set by use_onednn_linears
    panel_linear: PanelLinear | None = None  # set by use_onednn_linears, with:
    panels: torch.Tensor | None = None  # the weight as PanelLinear.pack gives it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.row_linear is not None and RowLinear.runs(x, self.weight):
            return self.row_linear(x, self.weight, self.bias)
        if self.panels is not None and self.panel_linear is not None and PanelLinear.runs(x, self.weight):
            return self.panel_linear(x, self.panels, self.out_features, self.bias)
        return _onednn(x, self._weight_for(x), self.bias)

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """self(x) + residual [.., out] in one call: the add is the GEMM's post-op (bitwise
        the separate add), so the output is written once instead of written, read and added."""
        if self.row_linear is not None and RowLinear.runs(x, self.weight) and residual.is_contiguous():
            return self.row_linear(x, self.weight, self.bias, residual)
        if (
            self.panels is not None
            and self.panel_linear is not None
            and PanelLinear.runs(x, self.weight)
            and residual.is_contiguous()
        ):
            return self.panel_linear(x, self.panels, self.out_features, self.bias, residual)
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self._weight_for(x), self.bias, "add")

    def _weight_for(self, x: torch.Tensor) -> torch.Tensor:
        if _one_row(x):
            return self.weight
        if self.packed is None:
            self.packed = _pack(self.weight)
        return self.packed


class FusedProjection:
    """Linear layers that read the same input (a layer's q, k, v; an MLP's gate and up) as
    one oneDNN call over their weights concatenated: one call and one pass over the input
    instead of one per layer. From two rows on the GEMM reads the concatenation packed once;
    one row runs the matrix-vector kernel over the plain concatenation, which the layers'
    weights become views of (no second copy). Each output is bitwise what its own layer
    computes (oneDNN splits the work by output column; checked for SmolLM2's shapes from 1
    to 640 rows). One decode step of SmolLM2-135M, one sequence, 2 threads at load 5: 71 ->
    57 ms (min of 20 steps), 7 -> 4 calls per layer. Not an nn.Module: no parameters of its
    own, nothing new in the model's state dict. Inference only. One or two fp32 rows run
    `row_linear` over the plain concatenation where it loaded (bitwise each layer's own call)."""

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        self.linears = tuple(linears)
        # the layers' own one- and two-row kernel (use_onednn_linears sets it), so that the
        # fusion and each layer alone give the same bits
        self.row_linear: RowLinear | None = getattr(linears[0], "row_linear", None)
        self.panel_linear: PanelLinear | None = getattr(linears[0], "panel_linear", None)
        self.plain = _concatenated(self.linears)  # [sum of out, in]
        self.packed = _pack(self.plain)
        self.panels = None if self.panel_linear is None else self.panel_linear.pack(self.plain)
        if self.panels is not None:  # each layer alone reads the same panels: the same bits
            _share_panels(self.linears, self.panels)
        # Qwen2's q, k, v have biases, Llama's none: a layer without one adds zeros
        biases = [
            linear.weight.new_zeros(linear.out_features) if linear.bias is None else linear.bias
            for linear in linears
        ]
        self.bias = None if all(linear.bias is None for linear in linears) else torch.cat(biases).detach()
        self.sizes = [linear.out_features for linear in linears]

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [.., in] -> each layer's output [.., out_i] (views of one result)."""
        if self.row_linear is not None and RowLinear.runs(x, self.plain):
            return self.row_linear(x, self.plain, self.bias).split(self.sizes, dim=-1)
        if self.panels is not None and self.panel_linear is not None and PanelLinear.runs(x, self.plain):
            return self.panel_linear(x, self.panels, self.plain.shape[0], self.bias).split(self.sizes, dim=-1)
        weight = self.plain if _one_row(x) else self.packed
        return _onednn(x, weight, self.bias).split(self.sizes, dim=-1)


def _concatenated(linears: Sequence[nn.Linear]) -> torch.Tensor:
    """The layers' weights as one [sum of out, in] tensor whose row blocks the layers' weights
    are (views): the tensor they already share when they are consecutive rows of one, else a
    concatenation that each layer's weight is then re-pointed into."""
    weights = [linear.weight.detach() for linear in linears]
    rows = sum(weight.shape[0] for weight in weights)
    first = weights[0]
    storage = first.untyped_storage().data_ptr()
    consecutive = all(
        weight.is_contiguous() and weight.untyped_storage().data_ptr() == storage for weight in weights
    ) and all(
        later.data_ptr() == earlier.data_ptr() + earlier.numel() * earlier.element_size()
        for earlier, later in itertools.pairwise(weights)
    )
    if consecutive:
        return first.as_strided((rows, first.shape[1]), first.stride())
    joined = torch.cat(weights)
    for linear, part in zip(linears, joined.split([weight.shape[0] for weight in weights]), strict=True):
        linear.weight = nn.Parameter(part, requires_grad=False)
    return joined


def _share_panels(linears: Sequence[nn.Linear], panels: torch.Tensor) -> None:
    """Each layer's panels: a view of the concatenation's `panels` where its rows start and end
    on a panel boundary (SmolLM2's, Llama's), else packed on their own."""
    first = 0
    for linear in linears:
        if isinstance(linear, OneDnnLinear) and linear.panel_linear is not None:
            size = linear.out_features
            aligned = first % PANEL == 0 and size % PANEL == 0
            linear.panels = (
                panels[first // PANEL : (first + size) // PANEL]
                if aligned
                else linear.panel_linear.pack(linear.weight)
            )
        first += linear.out_features


def linear_plus(linear: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """linear(x) + residual: one oneDNN call where the layer runs on oneDNN (a residual
    connection after a projection)."""
    if isinstance(linear, OneDnnLinear):
        return linear.plus(x, residual)
    return residual + linear(x)


def _one_row(x: torch.Tensor) -> bool:
    # One row runs oneDNN's matrix-vector kernel on the plain weight; the packed weight would
    # run it through the matrix kernel, rounded differently. From two rows on, plain and
    # packed weights give bitwise the same result (every SmolLM2 shape, 2 to 640 rows).
    return x.numel() == x.shape[-1]


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's blocked layout, in 2 MB pages where the kernel gives them (it
    is read from DRAM by every step of several rows: huge_pages.py)."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    if hasattr(torch.ops.mkldnn, "data_ptr") and hasattr(torch.ops.mkldnn, "_nbytes"):
        huge_pages.collapse(torch.ops.mkldnn.data_ptr(packed), torch.ops.mkldnn._nbytes(packed))
    return packed


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def use_onednn_linears(model: nn.Module, dtype: torch.dtype) -> KernelChoice:
    """Switches every nn.Linear of `model` (on the CPU) to oneDNN where this torch build and
    CPU run it correctly for `dtype`; otherwise changes nothing. Says which, and why."""
    for name, value in _KERNEL_CACHE_CAPACITY.items():
        os.environ.setdefault(name, value)
    unavailable = _onednn_unavailable(dtype)
    if unavailable is not None:
        log.info("onednn_linear_unavailable", reason=unavailable, dtype=str(dtype))
        return KernelChoice("torch", f"oneDNN linear unavailable for {dtype}: {unavailable}")
    row_linear, row_choice = load_row_linear() if dtype == torch.float32 else (None, None)
    panel_linear, panel_choice = load_panel_linear() if dtype == torch.float32 else (None, None)
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = OneDnnLinear
            module.row_linear = row_linear
            module.panel_linear = panel_linear
    fused: set[nn.Module] = set()
    for layer in getattr(getattr(model, "model", None), "layers", ()):
        attn, mlp = layer.self_attn, layer.mlp
        attn.fused_qkv = FusedProjection((attn.q_proj, attn.k_proj, attn.v_proj))
        mlp.fused_gate_up = FusedProjection((mlp.gate_proj, mlp.up_proj))
        fused.update(attn.fused_qkv.linears + mlp.fused_gate_up.linears)
    for module in model.modules():  # packed (and its pages collapsed, ~1 s) now, not in a step
        if isinstance(module, OneDnnLinear) and module not in fused:
            module.packed = _pack(module.weight)
            if panel_linear is not None:
                module.panels = panel_linear.pack(module.weight)
    rows = "".join(f"; {choice.reason}" for choice in (row_choice, panel_choice) if choice is not None)
    return KernelChoice("onednn", f"oneDNN's {dtype} inner product passed the probe against F.linear{rows}")


def _onednn_unavailable(dtype: torch.dtype) -> str | None:
    """Why oneDNN cannot run this model's linears, or None when it can."""
    if os.environ.get(UNAVAILABLE_VARIABLE) == "1":
        return f"{UNAVAILABLE_VARIABLE}=1"
    if not torch.backends.mkldnn.is_available() or not all(
        hasattr(torch.ops.mkldnn, op) for op in ("_linear_pointwise", "_reorder_linear_weight")
    ):
        return "torch built without oneDNN linear"
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 64, generator=generator).to(dtype)  # [batch, tokens, in]
    weight = torch.randn(48, 64, generator=generator).to(dtype)  # [out, in]
    bias = torch.randn(48, generator=generator).to(dtype)
    try:
        got = _onednn(x, _pack(weight), bias)  # six rows: the packed weight's case
    except RuntimeError as exc:  # e.g. no bf16 inner product on a CPU without AVX-512
        return str(exc).splitlines()[0]
    expected = nn.functional.linear(x.float(), weight.float(), bias.float())  # [batch, tokens, out]
    error = (
        (got.float() - expected).abs().max() / expected.abs().max()
        if got.shape == expected.shape
        else torch.inf
    )
    if not error < _PROBE_RELATIVE_TOLERANCE:
        return f"disagrees with F.linear (relative error {float(error):.3g})"
    return None
