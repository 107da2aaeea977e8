"""huge_pages.collapse: only whole 2 MB pages inside the range, contents unchanged, and what
it reports collapsed is in huge pages (the process's smaps say so)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from inference_worker import huge_pages
from inference_worker.cpu_linear import _pack

HUGE = huge_pages.HUGE_PAGE_BYTES


def _anon_huge_bytes(address: int) -> int:
    """AnonHugePages of the mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span[1], 16) <= address < int(span[2], 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


def test_a_range_without_a_whole_huge_page_is_left_alone() -> None:
    buffer = torch.ones(HUGE // 4)  # 2 MB, almost never 2 MB-aligned: no whole page inside
    start = buffer.data_ptr()
    aligned = start % HUGE == 0
    assert huge_pages.collapse(start + 4096, HUGE - 8192) == 0
    assert huge_pages.collapse(start, HUGE) in ((0, HUGE) if aligned else (0,))
    assert bool((buffer == 1).all())


def test_collapse_keeps_contents_and_reports_what_is_in_huge_pages() -> None:
    generator = torch.Generator().manual_seed(0)
    buffer = torch.randn(5 * HUGE // 4, generator=generator)  # 10 MB: at least 4 whole pages inside
    before = buffer.clone()
    done = huge_pages.collapse(buffer.data_ptr(), buffer.numel() * 4)
    assert done % HUGE == 0 and done <= 5 * HUGE
    assert torch.equal(buffer, before)
    if done:  # refused where the kernel is older than 6.1, THP is off or no huge page was free
        assert done >= 4 * HUGE
        assert _anon_huge_bytes(-(-buffer.data_ptr() // HUGE) * HUGE) >= done


def test_packed_weights_compute_the_same_after_collapse() -> None:
    generator = torch.Generator().manual_seed(1)
    weight, x = torch.randn(3072, 576, generator=generator), torch.randn(16, 576, generator=generator)
    packed = _pack(weight)  # 7 MB: collapsed where the kernel allows
    got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    expected = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(weight), None,
                                                  "none", [], "")  # fmt: skip
    assert torch.equal(got, expected)
