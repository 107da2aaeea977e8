"""Long-lived buffers (the linears' packed weights) moved into 2 MB pages, once, at load.

Why: a decode step of 16 sequences reads every layer's packed weight from DRAM (~540 MB of
SmolLM2-135M fp32; the L3 holds 32 MB) in oneDNN's GEMMs, and the hardware prefetcher stops
at each 4 KB page's end. The same 16-row GEMMs over 30 layers' distinct weights (qkv, o,
gate/up, down, lm_head), one thread, CPU time, alternated, medians of 14 [load 8.8-9.0]:
61.3 ms with 4 KB pages, 58.6 ms with the weights' 2 MB-aligned interiors collapsed (gate/up
24.7 -> 22.7, lm_head 11.3 -> 10.8; q/k/v and o, 1-2 MB each, hold no whole 2 MB page). The
one- and two-row path streams the plain weights no faster in huge pages (26.2 vs 27.3 ms),
so it keeps them as they are.

`MADV_COLLAPSE` (Linux 6.1+) moves existing pages into huge ones synchronously, in either
THP `enabled` mode (`always` or `madvise`): 286 MB took 1.3 s at load 9. Not an advice
for later first touches (`MADV_HUGEPAGE`): with `defrag` at madvise, those compact memory
inside the step that touches them (the KV pool's try, docs/inference-worker.md). Where the
kernel refuses (older than 6.1, THP off, no 2 MB page free), the buffer stays as it is:
only speed depends on it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable

MADV_COLLAPSE = 25  # linux/mman.h
HUGE_PAGE_BYTES = 2 << 20  # x86-64's and arm64's (4 KB base pages) PMD size


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or name is None:
        return None
    madvise = ctypes.CDLL(name, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def collapse(address: int, nbytes: int) -> int:
    """Asks the kernel to back the whole 2 MB pages inside [address, address + nbytes) with
    huge pages; the bytes it did (0 where it refused or no whole page fits). Contents are
    unchanged either way."""
    start = -(-address // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = (address + nbytes) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    madvise = _madvise()
    if madvise is None or end <= start:
        return 0
    return end - start if madvise(start, end - start, MADV_COLLAPSE) == 0 else 0
