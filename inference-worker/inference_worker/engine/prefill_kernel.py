"""The CPU prefill-attention kernel over block tables (paged_prefill.c): built with the
machine's C compiler on first use, cached, probed against torch's SDPA, loaded with ctypes
(decode_kernel.py says why plain C).

Why: a later turn's prefill (SmolLM2, 250-480 new tokens on 800-1,250 in the pool, fp32, one
thread) spent 32-43% of its forward in attention at ~60 GFLOP/s, torch's flash kernel over
the prefix and over the chunk causally, merged (chunk_attention.py), against ~100 for the
linears. This kernel tiles the query rows of all heads of a KV head together, reads each key
row once per tile where it lies in the pool, and masks only the chunks that cross the
diagonal (measurements: docs/inference-worker.md, "Prefill kernel pass").

It runs fp32 pools on a CPU, layers without a sliding window or whose context fits it, and
positions that follow slots (not prompt modules' explicit ones); the rest keeps torch's path.
`spans` attends one sequence's rows over keys where they lie outside the pool (a module
prompt's spans as read, then the rows' own: prefix_in_place.py), a span's keys re-positioned
by rotating the queries back instead of copying its keys rotated.
Where no compiler is found, the build fails or the probe disagrees with SDPA, the engine keeps
torch's path and says so (`KernelChoice`); `ATTNSTORE_PAGED_PREFILL_UNAVAILABLE=1` makes it
answer "unavailable" on any machine.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from inference_worker.kernels import KernelChoice, load_choice
from inference_worker.rotary_shift import rotate_half

SOURCE = Path(__file__).with_name("paged_prefill.c")
UNAVAILABLE_VARIABLE = "ATTNSTORE_PAGED_PREFILL_UNAVAILABLE"
_PROBE_TOLERANCE = 1e-5
_STATUS = {1: "heads that do not group over the KV heads", 2: "no memory"}  # paged_prefill.c's
_c_int, _c_ptr, _c_int64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64
_ARGTYPES = [_c_ptr] * 8 + [_c_int] * 4 + [_c_int64] + [_c_int] * 3 + [ctypes.c_float]
_SPAN_ARGTYPES = (
    [_c_ptr, _c_ptr, _c_int64, ctypes.c_int32, ctypes.c_int32, _c_ptr, _c_ptr]
    + [_c_int] * 5
    + [ctypes.c_float]
)
# A run of keys for `spans`: K, V [kv_heads, tokens, D] (any head and token strides, each row's
# elements contiguous) and the rotation (cos, sin [head_dim]) that re-positions its keys, or None.
KeySpan = tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]


class _Segment(ctypes.Structure):
    """paged_prefill.c's `Segment`."""

    _fields_ = [("k", _c_ptr), ("v", _c_ptr), *[(name, _c_int64) for name in ("k_head", "k_row", "v_head", "v_row")],
                ("cos", _c_ptr), ("sin", _c_ptr)]  # fmt: skip


@dataclass(frozen=True)
class PrefillTables:
    """A step's prefill chunks for the kernel, built once per step."""

    firsts: torch.Tensor  # [sequences] int64: each chunk's first row in the flattened batch
    news: torch.Tensor  # [sequences] int32: its new tokens
    starts: torch.Tensor  # [sequences] int32: its tokens already in the pool before them
    tables: torch.Tensor  # [sequences, most blocks] int32: block tables, padded with block 0

    @classmethod
    def of(cls, chunks: list[tuple[int, int, int, list[int]]], device: torch.device) -> PrefillTables:
        """From (first row, new tokens, start, block table) per chunk."""
        width = max(len(table) for *_, table in chunks)
        return cls(
            torch.tensor([first for first, *_ in chunks], dtype=torch.long, device=device),
            torch.tensor([new for _, new, _, _ in chunks], dtype=torch.int32, device=device),
            torch.tensor([start for _, _, start, _ in chunks], dtype=torch.int32, device=device),
            torch.tensor([t + [0] * (width - len(t)) for *_, t in chunks], dtype=torch.int32, device=device),
        )


class PagedPrefillKernel:
    """Prefill attention for one layer: `__call__` fills the chunks' rows of `out`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._function = library.paged_prefill_f32
        self._function.argtypes, self._function.restype = _ARGTYPES, ctypes.c_int
        self._spans = library.span_prefill_f32
        self._spans.argtypes, self._spans.restype = _SPAN_ARGTYPES, ctypes.c_int

    @staticmethod
    def supports(dtype: torch.dtype, device: torch.device) -> bool:
        return device.type == "cpu" and dtype == torch.float32

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, chunks: PrefillTables,
        *, scale: float,
    ) -> None:  # fmt: skip
        """q, out [tokens, heads, D] (contiguous); k, v one layer of the pool [kv_heads,
        blocks, B, D], the chunks' own K and V already written. Writes the chunks' rows of
        out, each row over its context's keys up to its own position; the other rows are left
        as they are."""
        tensors = (q, k, v, out, chunks.firsts, chunks.news, chunks.starts, chunks.tables)
        if not all(t.is_contiguous() for t in tensors):
            raise ValueError("the paged prefill kernel reads contiguous tensors only")
        if not all(t.dtype == torch.float32 for t in (q, k, v, out)):
            raise ValueError("the paged prefill kernel runs float32 only")
        kv_heads, blocks, block_tokens, head_dim = k.shape
        status = self._function(
            *(t.data_ptr() for t in tensors), chunks.firsts.shape[0], q.shape[1], kv_heads, head_dim,
            blocks, block_tokens, chunks.tables.shape[1], torch.get_num_threads(), scale,
        )  # fmt: skip
        _check(status)

    def spans(
        self, q: torch.Tensor, out: torch.Tensor, rows: slice, spans: list[KeySpan], *, scale: float
    ) -> None:
        """Writes out[rows] [rows, heads, D]: the rows of q (q, out [tokens, heads, D] contiguous
        fp32) at the positions after every span's keys, over the spans' keys, then causally
        over the last span, the rows' own K and V [kv_heads, rows, D]."""
        if (
            not (q.is_contiguous() and out.is_contiguous())
            or q.dtype != torch.float32
            or out.dtype != q.dtype
        ):
            raise ValueError("the span prefill kernel writes contiguous float32 q and out")
        segments, begins, at = (_Segment * len(spans))(), (ctypes.c_int64 * len(spans))(), 0
        kv_heads, news = spans[-1][0].shape[0], rows.stop - rows.start
        if spans[-1][0].shape[1] != news:
            raise ValueError(f"the last span holds the rows' own K and V: {news} tokens")
        for index, (k, v, rotation) in enumerate(spans):
            if k.dtype != torch.float32 or v.dtype != torch.float32 or k.stride(2) != 1 or v.stride(2) != 1:
                raise ValueError(
                    "the span prefill kernel reads float32 spans, each row's elements contiguous"
                )
            if k.shape != v.shape or k.shape[0] != kv_heads or k.shape[2] != q.shape[2]:
                raise ValueError("every span's K and V are [kv_heads, tokens, D] of the rows' heads")
            cos, sin = (None, None) if rotation is None else (rotation[0].data_ptr(), rotation[1].data_ptr())
            segments[index] = _Segment(k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), v.stride(0),
                                       v.stride(1), cos, sin)  # fmt: skip
            begins[index], at = at, at + k.shape[1]
        status = self._spans(
            q.data_ptr(), out.data_ptr(), rows.start, news, at - news, segments, begins, len(spans), q.shape[1],
            kv_heads, q.shape[2], torch.get_num_threads(), scale,
        )  # fmt: skip
        _check(status)


def _check(status: int) -> None:
    if status:
        raise RuntimeError(f"paged prefill kernel failed: {_STATUS.get(status, status)}")


@functools.cache
def load_paged_prefill() -> tuple[PagedPrefillKernel | None, KernelChoice]:
    """The kernel, or None and why not (once per process)."""
    chosen = KernelChoice("paged-prefill-c", "prefill attention in place over block tables (C, OpenMP)")
    return load_choice(SOURCE, UNAVAILABLE_VARIABLE, PagedPrefillKernel, _probe, chosen, "SDPA")


def _probe(kernel: PagedPrefillKernel) -> str | None:
    """Why the kernel's answer for a small scattered case disagrees with SDPA, or None."""
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, block = 4, 2, 16, 4
    k = torch.randn(kv_heads, 8, block, dim, generator=generator)
    v = torch.randn(kv_heads, 8, block, dim, generator=generator)
    q = torch.randn(9, heads, dim, generator=generator)
    table, start = [6, 1, 0, 3], 5  # 9 new tokens after 5: context 14 of 16 slots
    out = torch.zeros_like(q)
    kernel(q, k, v, out, PrefillTables.of([(0, 9, start, table)], q.device), scale=0.25)
    keys = k[:, table].reshape(kv_heads, -1, dim)[:, : start + 9]
    values = v[:, table].reshape(kv_heads, -1, dim)[:, : start + 9]
    allowed = torch.arange(start + 9)[None, :] <= torch.arange(start, start + 9)[:, None]
    want = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys[None], values[None], attn_mask=allowed, scale=0.25, enable_gqa=True
    )[0].transpose(0, 1)
    error = float((out - want).abs().max())
    if error > _PROBE_TOLERANCE:
        return f"disagrees with SDPA (max error {error:.3g})"
    # spans: the context's keys 0-1 (re-positioned) and 2-4, then the rows' own
    cos, sin = torch.randn(2, dim, generator=generator).chunk(2)
    angle = torch.atan2(sin[0, : dim // 2], cos[0, : dim // 2]).repeat(2)  # a rotation: cos^2 + sin^2 = 1
    rotation = (angle.cos(), angle.sin())
    stored = keys[:, :2].clone()
    keys[:, :2] = stored * rotation[0] + rotate_half(stored) * rotation[1]
    want = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys[None], values[None], attn_mask=allowed, scale=0.25, enable_gqa=True
    )[0].transpose(0, 1)
    out = torch.zeros_like(q)
    own = (keys[:, start:], values[:, start:])
    spans = [(stored, values[:, :2], rotation), (keys[:, 2:start], values[:, 2:start], None), (*own, None)]
    kernel.spans(q, out, slice(0, 9), spans, scale=0.25)
    error = float((out - want).abs().max())
    return None if error <= _PROBE_TOLERANCE else f"spans disagree with SDPA (max error {error:.3g})"
