"""A decoder layer's blocks around attention over a few fp32 CPU rows, each in one C call and
one parallel region (layer_blocks.c): before attention RMSNorm, the fused q/k/v projection,
RoPE and the pool write; after it o_proj + residual, RMSNorm, the fused gate/up projection,
SiLU(gate) * up and down_proj + residual. From panel_linear's MIN_ROWS to MAX_ROWS rows (a
16-sequence decode step, a doc-QA question), where the layers' linears run the panel kernel.

Why: at these rows only the calling thread ran the ~8 calls' Python, bindings and allocations a
layer, between 5 parallel regions, while the other thread slept; at two threads it was the
forward's critical path (docs/inference-worker.md, nineteenth pass, for the numbers). Loaded
like the decode kernel (c_build.py), probed against the torch composition; where it does not
build, load or agree, or a layer's linears have no panels, the runner keeps its separate calls.
`ATTNSTORE_LAYER_BLOCKS_UNAVAILABLE=1` forces that."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from inference_worker.engine.panel_linear import MAX_ROWS, MIN_ROWS, PanelLinear
from inference_worker.engine.row_kernels import SILU_ACTIVATIONS, torch_rms_norm, torch_rope, torch_silu_mul
from inference_worker.kernels import KernelChoice, load_choice
from inference_worker.model_geometry import ModelGeometry

SOURCE = Path(__file__).with_name("layer_blocks.c")
UNAVAILABLE_VARIABLE = "ATTNSTORE_LAYER_BLOCKS_UNAVAILABLE"
_PROBE_TOLERANCE = 1e-5  # relative: sums in another order than oneDNN's, far below a wrong build's
_c_int, _c_ptr, _c_int64, _c_float = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# layer_blocks.c's statuses (it checks rows against 1..MAX_ROWS; the runner calls it from MIN_ROWS)
_ERRORS = {1: f"takes 1 to {MAX_ROWS} rows", 2: "a slot outside the pool", 3: "out of memory"}


@dataclass(frozen=True)
class LayerWeights:
    """What the blocks read of one decoder layer: the norms' weights, the linears' weights as
    PanelLinear.pack gives them (q/k/v and gate/up each concatenated) and their biases."""

    input_norm: torch.Tensor
    input_eps: float
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    post_eps: float
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    geometry: ModelGeometry
    intermediate: int

    @classmethod
    def of(cls, layer: nn.Module, geometry: ModelGeometry) -> LayerWeights | None:
        """The layer's, or None where its linears have no panels (not fp32 on a CPU, the panel
        kernel unavailable) or its MLP's activation is not SiLU."""
        attn, mlp = layer.self_attn, layer.mlp
        fused_qkv, fused_gate_up = getattr(attn, "fused_qkv", None), getattr(mlp, "fused_gate_up", None)
        panels = [
            getattr(part, "panels", None) for part in (fused_qkv, attn.o_proj, fused_gate_up, mlp.down_proj)
        ]
        if any(p is None for p in panels) or type(mlp.act_fn) not in SILU_ACTIVATIONS:
            return None
        assert fused_qkv is not None and fused_gate_up is not None  # they have panels
        qkv, o, gate_up, down = panels
        norms = layer.input_layernorm, layer.post_attention_layernorm
        return cls(
            norms[0].weight.detach(), norms[0].variance_epsilon, qkv, fused_qkv.bias, o, attn.o_proj.bias,
            norms[1].weight.detach(), norms[1].variance_epsilon, gate_up, fused_gate_up.bias, down,
            mlp.down_proj.bias, geometry, mlp.down_proj.in_features,
        )  # fmt: skip

    @functools.cached_property
    def struct(self) -> _Layer:
        """The weights as layer_blocks.c's `struct layer` (made once: the pointers stay valid
        while these tensors live)."""
        pointers = [
            _pointer(t)
            for t in (
                self.input_norm,
                self.qkv,
                self.qkv_bias,
                self.o,
                self.o_bias,
                self.post_norm,
                self.gate_up,
                self.gate_up_bias,
                self.down,
                self.down_bias,
            )
        ]
        geometry = self.geometry
        return _Layer(*pointers, self.input_eps, self.post_eps, self.input_norm.shape[0], geometry.heads,
                      geometry.kv_heads, geometry.head_dim, self.intermediate)  # fmt: skip


class _Layer(ctypes.Structure):
    """layer_blocks.c's `struct layer`."""

    _fields_ = [
        *[(name, _c_ptr) for name in ("input_norm", "qkv", "qkv_bias", "o", "o_bias", "post_norm", "gate_up",
                                      "gate_up_bias", "down", "down_bias")],
        ("input_eps", _c_float), ("post_eps", _c_float),
        *[(name, _c_int) for name in ("width", "heads", "kv_heads", "head_dim", "intermediate")],
    ]  # fmt: skip


class _AttentionInputs(ctypes.Structure):
    """layer_blocks.c's `struct attention_inputs`."""

    _fields_ = [*[(name, _c_ptr) for name in ("cos", "sin", "qkv", "q", "k", "k_pool", "v_pool", "slots")],
                ("pool_slots", _c_int64)]  # fmt: skip


class LayerBlocks:
    def __init__(self, library: ctypes.CDLL) -> None:
        self._pre, self._post = library.pre_attention_f32, library.post_attention_f32
        self._between = library.between_layers_f32
        self._pre.argtypes = [_c_ptr, _c_ptr, _c_ptr, _c_int, _c_int]
        self._post.argtypes = [_c_ptr] * 4 + [_c_int, _c_int]
        self._between.argtypes = [_c_ptr] * 6 + [_c_int, _c_int]
        self._pre.restype = self._post.restype = self._between.restype = _c_int

    @staticmethod
    def runs(hidden: torch.Tensor) -> bool:
        """Whether the blocks run these rows [rows, hidden]: MIN_ROWS to MAX_ROWS fp32 CPU rows,
        contiguous (the layers' weights are, where LayerWeights.of gives them)."""
        return (
            hidden.dtype == torch.float32
            and hidden.device.type == "cpu"
            and hidden.dim() == 2
            and MIN_ROWS <= hidden.shape[0] <= MAX_ROWS
            and hidden.is_contiguous()
        )

    def pre_attention(
        self, weights: LayerWeights, hidden: torch.Tensor, pool: AttentionPool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [rows, heads, D] and k [rows, kv_heads, D] rotated, v [rows, kv_heads, D], of the
        layer's normed rows `hidden`; k and v written into `pool`."""
        inputs, qkv = _attention_inputs(weights, hidden.shape[0], pool)
        self._check(self._pre(ctypes.byref(weights.struct), hidden.data_ptr(), ctypes.byref(inputs),
                              hidden.shape[0], torch.get_num_threads()))  # fmt: skip
        return qkv

    def post_attention(self, weights: LayerWeights, attn: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's output [rows, hidden]: the MLP block after o_proj(attn) + hidden, with
        their residuals. attn [rows, heads * D] contiguous."""
        y = _output(weights, attn, hidden)
        self._check(self._post(ctypes.byref(weights.struct), attn.data_ptr(), hidden.data_ptr(), y.data_ptr(),
                               hidden.shape[0], torch.get_num_threads()))  # fmt: skip
        return y

    def between_layers(
        self,
        weights: LayerWeights,
        attn: torch.Tensor,
        hidden: torch.Tensor,
        following: LayerWeights,
        pool: AttentionPool,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """`post_attention` of one layer, then `pre_attention` of the `following` on its output,
        in one call: the output and the following layer's q, k, v."""
        y = _output(weights, attn, hidden)
        inputs, qkv = _attention_inputs(following, hidden.shape[0], pool)
        self._check(self._between(
            ctypes.byref(weights.struct), attn.data_ptr(), hidden.data_ptr(), y.data_ptr(),
            ctypes.byref(following.struct), ctypes.byref(inputs), hidden.shape[0], torch.get_num_threads(),
        ))  # fmt: skip
        return y, qkv

    @staticmethod
    def _check(status: int) -> None:
        if status:
            raise ValueError(_ERRORS[status])


@dataclass(frozen=True)
class AttentionPool:
    """Where pre_attention puts a layer's k and v, and how it rotates q and k: the pool layer
    (k_pool, v_pool [kv_heads, blocks, B, D], contiguous fp32), the rows' `slots` [rows] int64,
    and cos, sin [rows, 1, D] (`rotary`)."""

    k_pool: torch.Tensor
    v_pool: torch.Tensor
    slots: torch.Tensor
    rotary: tuple[torch.Tensor, torch.Tensor]


def _attention_inputs(
    weights: LayerWeights, rows: int, pool: AttentionPool
) -> tuple[_AttentionInputs, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """pre_attention's struct and outputs q, k, v (a view of its q/k/v projection)."""
    (k_pool, v_pool, slots), (cos, sin) = (pool.k_pool, pool.v_pool, pool.slots), pool.rotary
    geometry = weights.geometry
    heads, kv_heads, dim = geometry.heads, geometry.kv_heads, geometry.head_dim
    if not (k_pool.is_contiguous() and v_pool.is_contiguous() and k_pool.shape == v_pool.shape) or any(
        t.dtype != torch.float32 for t in (k_pool, v_pool)
    ):
        raise ValueError("pre_attention writes contiguous fp32 pool layers of one shape")
    if slots.dtype != torch.int64 or slots.shape != (rows,) or not slots.is_contiguous():
        raise ValueError(f"slots must be int64 [{rows}], not {slots.dtype} {list(slots.shape)}")
    if cos.shape != (rows, 1, dim) or not (cos.is_contiguous() and sin.is_contiguous()) or dim % 2:
        raise ValueError(f"cos and sin must be contiguous [{rows}, 1, {dim}], the head dimension even")
    qkv = torch.empty(rows, (heads + 2 * kv_heads) * dim)
    q, k = torch.empty(rows, heads, dim), torch.empty(rows, kv_heads, dim)
    inputs = _AttentionInputs(cos.data_ptr(), sin.data_ptr(), qkv.data_ptr(), q.data_ptr(), k.data_ptr(),
                              k_pool.data_ptr(), v_pool.data_ptr(), slots.data_ptr(),
                              k_pool.shape[1] * k_pool.shape[2])  # fmt: skip
    return inputs, (q, k, qkv[:, (heads + kv_heads) * dim :].view(rows, kv_heads, dim))


def _output(weights: LayerWeights, attn: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """post_attention's output, its inputs checked."""
    width = weights.geometry.heads * weights.geometry.head_dim
    if not attn.is_contiguous() or attn.shape != (hidden.shape[0], width):
        raise ValueError(f"attn must be contiguous [rows, {width}], a row per hidden row")
    return torch.empty(hidden.shape)


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


@functools.cache
def load_layer_blocks() -> tuple[LayerBlocks | None, KernelChoice]:
    """The blocks, or None and why not (once per process)."""
    chosen = KernelChoice("layer-blocks-c", f"a layer's blocks around attention in one C call each, "
                          f"{MIN_ROWS} to {MAX_ROWS} rows")  # fmt: skip
    return load_choice(SOURCE, UNAVAILABLE_VARIABLE, LayerBlocks, _probe, chosen, "a call per op")


def reference_pre_attention(
    weights: LayerWeights,
    plain: tuple[torch.Tensor, ...],
    hidden: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pre_attention's q, k, v in torch ops, from the layer's plain q/k/v weight `plain[0]`."""
    geometry = weights.geometry
    qkv = F.linear(torch_rms_norm(hidden, weights.input_norm, weights.input_eps), plain[0], weights.qkv_bias)
    q, k, v = qkv.split(
        [geometry.heads * geometry.head_dim, *[geometry.kv_heads * geometry.head_dim] * 2], -1
    )
    q, k, v = (t.reshape(hidden.shape[0], -1, geometry.head_dim) for t in (q, k, v))
    return (*torch_rope(q, k, *rotary), v)


def reference_post_attention(
    weights: LayerWeights, plain: tuple[torch.Tensor, ...], attn: torch.Tensor, hidden: torch.Tensor
) -> torch.Tensor:
    """post_attention's output in torch ops, from the layer's plain o, gate/up, down weights `plain[1:]`."""
    mid = F.linear(attn, plain[1], weights.o_bias) + hidden
    gate, up = F.linear(
        torch_rms_norm(mid, weights.post_norm, weights.post_eps), plain[2], weights.gate_up_bias
    ).chunk(2, -1)
    return F.linear(torch_silu_mul(gate, up), plain[3], weights.down_bias) + mid


def random_layer(
    geometry: ModelGeometry, width: int, intermediate: int, generator: torch.Generator, bias: bool = True
) -> tuple[LayerWeights, tuple[torch.Tensor, ...]]:
    """A layer of random weights (hidden size `width`) and its plain q/k/v, o, gate/up and down
    weights [out, in]."""
    dim = geometry.head_dim
    shapes = [((geometry.heads + 2 * geometry.kv_heads) * dim, width), (width, geometry.heads * dim),
              (2 * intermediate, width), (width, intermediate)]  # fmt: skip
    plain = tuple(torch.randn(shape, generator=generator) / shape[1] ** 0.5 for shape in shapes)
    biases = [torch.randn(shape[0], generator=generator) if bias else None for shape in shapes]
    norms = (torch.rand(width, generator=generator) + 0.5 for _ in range(2))
    packed = [PanelLinear.pack(weight) for weight in plain]
    weights = LayerWeights(next(norms), 1e-5, packed[0], biases[0], packed[1], biases[1], next(norms), 1e-6,
                           packed[2], biases[2], packed[3], biases[3], geometry, intermediate)  # fmt: skip
    return weights, plain


def _probe(blocks: LayerBlocks) -> str | None:
    """Why the blocks disagree with the torch composition on a small layer, or None."""
    generator = torch.Generator().manual_seed(0)
    geometry = ModelGeometry(num_layers=1, heads=4, kv_heads=2, head_dim=10, max_positions=64, vocab_size=1)
    weights, plain = random_layer(geometry, 40, 48, generator)  # 40 and 48: padded panels, not whole vectors
    rows = 15  # two tiles of registers
    hidden, attn = torch.randn(rows, 40, generator=generator), torch.randn(rows, 40, generator=generator)
    rotary = (torch.randn(rows, 1, 10, generator=generator), torch.randn(rows, 1, 10, generator=generator))
    kv, slots = torch.zeros(2, 2, 8, 4, 10), torch.randperm(32, generator=generator)[:rows]
    pool = AttentionPool(kv[0], kv[1], slots, rotary)
    pre = blocks.pre_attention(weights, hidden, pool)  # between_layers: the post, then the pre on its output
    post, following = blocks.between_layers(weights, attn, hidden, weights, pool)
    written = tuple(layer.view(2, -1, 10)[:, slots].transpose(0, 1) for layer in kv)
    want_post = reference_post_attention(weights, plain, attn, hidden)
    want_following = reference_pre_attention(weights, plain, want_post, rotary)
    pairs = [
        *zip(pre, reference_pre_attention(weights, plain, hidden, rotary), strict=True),
        (post, want_post),
        *zip(following, want_following, strict=True),
        *zip(written, want_following[1:], strict=True),
    ]
    error = max(float((a - b).abs().max() / b.abs().max()) for a, b in pairs)
    return None if error <= _PROBE_TOLERANCE else f"disagrees with torch (relative error {error:.3g})"
