"""The CPU decode-attention kernel over block tables (paged_decode.c): built with the
machine's C compiler on first use, cached, probed against torch's SDPA, loaded with ctypes.

Why: a decode step of 16 SmolLM2 sequences (300-1,050 cached tokens, fp32, one thread) spent
~70 ms gathering scattered block tables into one buffer per layer and ~90 ms in 480 SDPA
calls (one per sequence and layer, torch's flash kernel on one query row) beside ~180 ms of
linears: attention read every cached K and V twice and paid a call per sequence. The kernel
reads each sequence's blocks where they lie, all sequences of a layer in one call, the
query heads of a KV head sharing one pass over its keys, as vLLM's CPU paged-attention
kernel does (measurements: docs/inference-worker.md, "Speed").

Why plain C through ctypes and not a torch C++ extension (`torch.utils.cpp_extension`):
the extension's torch headers took 27 s of CPU (92 s wall at load 9) to build a one-line
op on the development machine, at every fresh worker start; this file builds in about a
second. No library ships such a kernel for this torch: Intel's extension is pinned to
torch 2.8, vLLM's is built against its own torch.

Where no compiler is found, the build fails, or the probe disagrees with SDPA, the engine
keeps torch's path (gather + SDPA), and says so (`KernelChoice`). `ATTNSTORE_PAGED_DECODE_UNAVAILABLE=1`
makes it answer "unavailable" on any machine, so tests run that path everywhere.
"""

from __future__ import annotations

import ctypes
import functools
from abc import ABC, abstractmethod
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from inference_worker.kernels import KernelChoice, load_choice

SOURCE = Path(__file__).with_name("paged_decode.c")
UNAVAILABLE_VARIABLE = "ATTNSTORE_PAGED_DECODE_UNAVAILABLE"
_PROBE_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
_FUNCTIONS = {torch.float32: "paged_decode_f32", torch.bfloat16: "paged_decode_bf16"}
_c_int, _c_ptr = ctypes.c_int, ctypes.c_void_p
_ARGTYPES = [_c_ptr] * 7 + [_c_int] * 4 + [ctypes.c_int64] + [_c_int] * 4 + [ctypes.c_float]


class DecodeCall(NamedTuple):
    """One layer's decode attention, as `DecodeAttention.__call__` took it."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    rows: torch.Tensor
    tables: torch.Tensor
    lens: torch.Tensor
    scale: float
    window: int | None
    lse: torch.Tensor | None


class DecodeAttention(ABC):
    """Decode attention for one layer over block tables: `__call__` fills the decode rows of
    `out`. One contract, two implementations: this C kernel on a CPU, one batched torch call
    on a GPU (decode_batched.py)."""

    what = "decode attention"  # how errors name the implementation

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        rows: torch.Tensor,
        tables: torch.Tensor,
        lens: torch.Tensor,
        *,
        scale: float,
        window: int | None,
        lse: torch.Tensor | None = None,
    ) -> None:
        """q, out [tokens, heads, D] (contiguous); k, v one layer of the pool [kv_heads,
        blocks, B, D]; rows [sequences] int64 (each decode token's row), tables [sequences,
        max_blocks] int32, lens [sequences] int32 (context tokens, the decode token's own
        included). Writes out[rows]; the other rows are left as they are. `lse` [sequences,
        heads] fp32, when given: each head's log-sum-exp of its scaled scores (a partial,
        dist_attention/partial.py)."""
        tensors = (
            (q, k, v, out, rows, tables, lens) if lse is None else (q, k, v, out, rows, tables, lens, lse)
        )
        if not all(t.is_contiguous() for t in tensors):
            raise ValueError(f"{self.what} reads contiguous tensors only")
        if lse is not None and (lse.dtype != torch.float32 or lse.shape != (rows.shape[0], q.shape[1])):
            raise ValueError(
                f"lse must be fp32 [{rows.shape[0]}, {q.shape[1]}], not {lse.dtype} {list(lse.shape)}"
            )
        self._attend(DecodeCall(q, k, v, out, rows, tables, lens, scale, window, lse))

    @abstractmethod
    def _attend(self, call: DecodeCall) -> None: ...


class PagedDecodeKernel(DecodeAttention):
    what = "the paged decode kernel"

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions, self._lse_functions = {}, {}
        for dtype, name in _FUNCTIONS.items():
            function, with_lse = getattr(library, name), getattr(library, f"{name}_lse")
            function.argtypes, function.restype = _ARGTYPES, ctypes.c_int
            with_lse.argtypes, with_lse.restype = [*_ARGTYPES, _c_ptr], ctypes.c_int
            self._functions[dtype], self._lse_functions[dtype] = function, with_lse

    def supports(self, dtype: torch.dtype, device: torch.device) -> bool:
        return device.type == "cpu" and dtype in self._functions

    def _attend(self, call: DecodeCall) -> None:
        q, k, v, out, rows, tables, lens, scale, window, lse = call
        kv_heads, blocks, block_tokens, head_dim = k.shape
        arguments = (
            q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), rows.data_ptr(),
            tables.data_ptr(), lens.data_ptr(), rows.shape[0], q.shape[1], kv_heads, head_dim,
            blocks, block_tokens, tables.shape[1], window or 0, torch.get_num_threads(), scale,
        )  # fmt: skip
        if lse is None:
            status = self._functions[q.dtype](*arguments)
        else:
            status = self._lse_functions[q.dtype](*arguments, lse.data_ptr())
        if status:
            raise RuntimeError(
                f"paged decode kernel failed (status {status}: 1 unsupported heads, 2 no memory)"
            )


@functools.cache
def load_paged_decode() -> tuple[PagedDecodeKernel | None, KernelChoice]:
    """The kernel, or None and why not (once per process)."""
    chosen = KernelChoice("paged-decode-c", "decode attention in place over block tables (C, OpenMP)")
    return load_choice(SOURCE, UNAVAILABLE_VARIABLE, PagedDecodeKernel, _probe, chosen, "gather + SDPA")


def _probe(kernel: PagedDecodeKernel) -> str | None:
    """Why the kernel's answer for a small scattered case disagrees with SDPA, or None."""
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, block, lens = 4, 2, 16, 4, [5, 9]
    for dtype, tolerance in _PROBE_TOLERANCE.items():
        k = torch.randn(kv_heads, 8, block, dim, generator=generator).to(dtype)
        v = torch.randn(kv_heads, 8, block, dim, generator=generator).to(dtype)
        q = torch.randn(3, heads, dim, generator=generator).to(dtype)
        tables = torch.tensor([[6, 1, 0], [3, 7, 2]], dtype=torch.int32)
        out = torch.zeros_like(q)
        rows = torch.tensor([2, 0])
        kernel(q, k, v, out, rows, tables, torch.tensor(lens, dtype=torch.int32), scale=0.25, window=None)
        for row, table, n in zip(rows.tolist(), tables.tolist(), lens, strict=True):
            keys = k[:, table].reshape(kv_heads, -1, dim)[:, :n].float()
            values = v[:, table].reshape(kv_heads, -1, dim)[:, :n].float()
            want = F.scaled_dot_product_attention(
                q[row].float()[None, :, None], keys[None], values[None], scale=0.25, enable_gqa=True
            )[0, :, 0]  # [heads, D]
            error = float((out[row].float() - want).abs().max())
            if not error <= tolerance:
                return f"disagrees with SDPA for {dtype} (max error {error:.3g})"
    return None
