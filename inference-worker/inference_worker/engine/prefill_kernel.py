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

SOURCE = Path(__file__).with_name("paged_prefill.c")
UNAVAILABLE_VARIABLE = "ATTNSTORE_PAGED_PREFILL_UNAVAILABLE"
_PROBE_TOLERANCE = 1e-5
_STATUS = {1: "heads that do not group over the KV heads", 2: "no memory"}  # paged_prefill.c's
_c_int, _c_ptr = ctypes.c_int, ctypes.c_void_p
_ARGTYPES = [_c_ptr] * 8 + [_c_int] * 4 + [ctypes.c_int64] + [_c_int] * 3 + [ctypes.c_float]


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
    return None if error <= _PROBE_TOLERANCE else f"disagrees with SDPA (max error {error:.3g})"
