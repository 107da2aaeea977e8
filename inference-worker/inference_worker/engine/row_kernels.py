"""RMSNorm, RoPE, SiLU-mul and the joining of a module span (a copy with keys re-positioned) in
one C call each (row_ops.c), for fp32 rows on a CPU, loaded like the decode kernel
(c_build.py), probed against transformers' own ops.

Why: after the linears, per-op dispatch was ~27% of a one-sequence SmolLM2 decode step
(~40 small torch ops per layer; docs/inference-worker.md). Where the library does not build
or load, or its probe disagrees with torch, the runner keeps the torch ops and says so;
`ATTNSTORE_ROW_KERNELS_UNAVAILABLE=1` forces that path."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import nn
from transformers.activations import SiLUActivation

from inference_worker.kernels import KernelChoice, load_choice
from inference_worker.rotary_shift import rotate_half, rotate_into

SOURCE = Path(__file__).with_name("row_ops.c")
UNAVAILABLE_VARIABLE = "ATTNSTORE_ROW_KERNELS_UNAVAILABLE"
_PROBE_TOLERANCE = 1e-6  # the ops round as torch's do: a probe off by more is a wrong build
_c_int, _c_ptr, _c_int64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64
SILU_ACTIVATIONS = (nn.SiLU, SiLUActivation)  # what transformers makes of "swish" and "silu"


class RowKernels:
    def __init__(self, library: ctypes.CDLL) -> None:
        self._rms_norm, self._rope, self._join = library.rms_norm_f32, library.rope_f32, library.join_span_f32
        self._rms_norm.argtypes = [_c_ptr, _c_int64, _c_ptr, _c_ptr, _c_int64, _c_int, ctypes.c_float, _c_int]
        self._rope.argtypes = [_c_ptr, _c_int64, _c_ptr, _c_int64, *[_c_ptr] * 4, _c_int64, *[_c_int] * 4,
                               _c_ptr, _c_int64, *[_c_ptr] * 3, _c_int64]  # fmt: skip
        self._join.argtypes = [*[_c_ptr] * 2, *[_c_int64] * 2, *[_c_ptr] * 2, _c_int64, *[_c_ptr] * 2, _c_int64,
                               *[_c_int] * 3]  # fmt: skip
        self._silu_mul = library.silu_mul_f32
        self._silu_mul.argtypes = [_c_ptr, _c_ptr, _c_int64, _c_ptr, _c_int64, _c_int, _c_int]
        self._rms_norm.restype = self._rope.restype = self._join.restype = self._silu_mul.restype = _c_int

    @staticmethod
    def supports(x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype == torch.float32

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """weight * x / sqrt(mean(x^2) + eps) of rows x [rows, dim] (rows may be strided)."""
        if x.dim() != 2 or x.stride(1) != 1 or not weight.is_contiguous():
            raise ValueError("rms_norm reads rows [rows, dim] with contiguous elements")
        out = torch.empty(x.shape, dtype=x.dtype)
        self._rms_norm(x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1],
                       eps, torch.get_num_threads())  # fmt: skip
        return out

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up [rows, inter] in one pass (torch: silu, then mul_ over its output);
        gate and up [rows, inter] with contiguous elements and one row stride (the halves of
        the fused gate/up projection's output)."""
        if gate.shape != up.shape or gate.dim() != 2 or gate.stride() != up.stride() or gate.stride(1) != 1:
            raise ValueError(
                "silu_mul reads gate and up [rows, inter] of one row stride, elements contiguous"
            )
        act = torch.empty(gate.shape, dtype=gate.dtype)
        self._silu_mul(gate.data_ptr(), up.data_ptr(), gate.stride(0), act.data_ptr(), gate.shape[0], gate.shape[1],
                       torch.get_num_threads())  # fmt: skip
        return act

    def rope(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q * cos + rotate_half(q) * sin and the same of k, both contiguous: q [tokens,
        heads, D], k [tokens, kv_heads, D] (heads contiguous in a row), cos, sin [tokens, 1, D]."""
        return self._rope_call(q, k, cos, sin, (None, 0, None, None, None, 0))

    def rope_into_pool(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        slots: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`rope`, and the rotated k and v [tokens, kv_heads, D] written into one layer of the
        paged pool (k_pool, v_pool [kv_heads, blocks, B, D], contiguous) at `slots` [tokens]
        int64: what PagedKV.write does, in the same call."""
        if not (k_pool.is_contiguous() and v_pool.is_contiguous() and k_pool.shape == v_pool.shape) or any(
            t.dtype != torch.float32 for t in (v, k_pool, v_pool)
        ):
            raise ValueError("rope_into_pool writes contiguous fp32 pool layers of one shape")
        if v.shape != k.shape or v.stride(2) != 1 or v.stride(1) != v.shape[2]:
            raise ValueError("v must be [tokens, kv_heads, D] like k, heads contiguous in a row")
        if slots.dtype != torch.int64 or slots.shape != (q.shape[0],) or not slots.is_contiguous():
            raise ValueError(f"slots must be int64 [{q.shape[0]}], not {slots.dtype} {list(slots.shape)}")
        pool = (k_pool.data_ptr(), v_pool.data_ptr(), slots.data_ptr(), k_pool.shape[1] * k_pool.shape[2])
        return self._rope_call(q, k, cos, sin, (v.data_ptr(), v.stride(0), *pool))

    @staticmethod
    def joins(k: torch.Tensor, v: torch.Tensor, k_out: torch.Tensor, v_out: torch.Tensor) -> bool:
        """Whether join_span takes these: fp32 on a CPU, one shape, each head's tokens contiguous
        (a read's tensors; a selection pass's exact layers may be laid out otherwise), k_out and
        v_out of one head stride. A handful of attribute reads: asked per span and layer."""
        shape, dim = k.shape, k.shape[2]
        return (
            k_out.device.type == "cpu"
            and k_out.stride(0) == v_out.stride(0)
            and all(
                t.dtype == torch.float32 and t.shape == shape and t.stride(2) == 1 and t.stride(1) == dim
                for t in (k, v, k_out, v_out)
            )
        )

    def join_span(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_out: torch.Tensor,
        v_out: torch.Tensor,
        rotation: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> None:
        """k, v [kv_heads, tokens, D] (a module span) copied into k_out, v_out of their shape
        (a joined layer's slice), k rotated by `rotation` (cos, sin [head_dim], contiguous)
        when not None: rotary_shift.rotate_into and a copy of v in one pass. Raises
        ValueError where `joins` says no."""
        if not self.joins(k, v, k_out, v_out):
            raise ValueError(
                "join_span copies fp32 CPU [kv_heads, tokens, D] of one shape, each head's tokens contiguous, "
                "into k_out and v_out of one layout"
            )
        shape, dim = k.shape, k.shape[2]
        cos, sin = (None, None) if rotation is None else (rotation[0].data_ptr(), rotation[1].data_ptr())
        status = self._join(k.data_ptr(), v.data_ptr(), k.stride(0), v.stride(0), k_out.data_ptr(), v_out.data_ptr(),
                            k_out.stride(0), cos, sin, shape[1], shape[0], dim, torch.get_num_threads())  # fmt: skip
        if status:
            raise ValueError(f"join_span needs an even head dimension, not {k.shape[2]}")

    def _rope_call(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write: tuple[int | None, ...],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, heads, dim = q.shape
        if any(t.stride(2) != 1 or t.stride(1) != dim for t in (q, k)) or not (
            cos.is_contiguous() and sin.is_contiguous()
        ):
            raise ValueError("rope reads rows of contiguous heads and contiguous cos, sin")
        q_out, k_out = torch.empty(q.shape, dtype=q.dtype), torch.empty(k.shape, dtype=k.dtype)
        status = self._rope(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), cos.data_ptr(), sin.data_ptr(),
                            q_out.data_ptr(), k_out.data_ptr(), tokens, heads, k.shape[1], dim,
                            torch.get_num_threads(), *write)  # fmt: skip
        if status == 1:
            raise ValueError(f"rope needs an even head dimension, not {dim}")
        if status:
            raise ValueError("a slot outside the pool")
        return q_out, k_out


@functools.cache
def load_row_kernels() -> tuple[RowKernels | None, KernelChoice]:
    """The kernels, or None and why not (once per process)."""
    chosen = KernelChoice(
        "row-ops-c", "RMSNorm, RoPE, SiLU-mul and a module span's joining in one C call each"
    )
    return load_choice(
        SOURCE,
        UNAVAILABLE_VARIABLE,
        RowKernels,
        _probe,
        chosen,
        "torch's RMSNorm, RoPE, SiLU-mul and span join",
    )


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic (fp32)."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def torch_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """apply_rotary_pos_emb's arithmetic."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def torch_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """LlamaMLP's act_fn(gate) * up (fp32)."""
    return torch.nn.functional.silu(gate) * up


def _probe(kernels: RowKernels) -> str | None:
    """Why the kernels disagree with torch's ops on a small case, or None."""
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(3, 40, generator=generator), torch.randn(40, generator=generator)
    qkv = torch.randn(3, 8, 8, generator=generator)  # q: 4 heads, k and v: 2
    (q, k), (cos, sin) = (qkv[:, :4], qkv[:, 4:6]), torch.randn(2, 3, 1, 8, generator=generator)
    v, slots = qkv[:, 6:], torch.tensor([5, 0, 3])
    # 40 columns: two vectors of 16 and a scalar tail; the halves of one tensor, as the MLP's
    halves = (torch.randn(3, 80, generator=generator) * 4).chunk(2, -1)
    want_act = torch_silu_mul(*halves)
    pool = torch.zeros(2, 2, 4, 2, 8)  # K and V: 2 KV heads, 4 blocks of 2 tokens
    kernels.rope_into_pool(q, k, v, cos, sin, pool[0], pool[1], slots)
    want_k = torch_rope(q, k, cos, sin)[1]
    written = pool.view(2, 2, -1, 8)[:, :, slots].transpose(1, 2)  # [K/V, tokens, kv_heads, D]
    stored = torch.randn(2, 2, 5, 8, generator=generator)  # K/V, kv_heads, tokens, D
    joined = torch.zeros(2, 2, 7, 8)
    cos_sin = (cos[0, 0].contiguous(), sin[0, 0].contiguous())  # one rotation [D]
    kernels.join_span(stored[0, :, 1:4], stored[1, :, 1:4], joined[0, :, 2:5], joined[1, :, 2:5], cos_sin)
    rotated = torch.empty(2, 3, 8)
    rotate_into(rotated, stored[0, :, 1:4], *cos_sin)
    errors = {
        "rms_norm": (kernels.rms_norm(x, weight, 1e-5) - torch_rms_norm(x, weight, 1e-5)).abs().max(),
        "rope": max(
            (a - b).abs().max() for a, b in zip(kernels.rope(q, k, cos, sin), torch_rope(q, k, cos, sin))
        ),
        "rope_into_pool": (written - torch.stack([want_k, v])).abs().max(),
        "join_span": (joined[:, :, 2:5] - torch.stack([rotated, stored[1, :, 1:4]])).abs().max(),
        "silu_mul": (kernels.silu_mul(*halves) - want_act).abs().max() / want_act.abs().max(),  # relative
    }
    wrong = [
        f"{name} (max error {float(e):.3g})" for name, e in errors.items() if not float(e) <= _PROBE_TOLERANCE
    ]
    return f"disagrees with torch: {', '.join(wrong)}" if wrong else None
