"""Fixed-size block allocation for the DRAM arena.

Blocks never fragment: a chunk of any size takes whole blocks, and any free block fits
any chunk (as in PagedAttention). The free list is a min-heap, so the lowest ids go
first and a fresh arena hands out contiguous runs that merge into few extents.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from attnstore.errors import ResourceExhausted


class OutOfBlocks(ResourceExhausted):
    """Fewer free blocks than requested; the caller evicts or reports RESOURCE_EXHAUSTED."""


class BlockAllocator:
    """Hands out block ids in [0, num_blocks); each id is held by at most one owner."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        self._num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks))  # already a valid heap
        self._allocated = bytearray(num_blocks)  # 1 = handed out; catches double frees

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def used_count(self) -> int:
        return self._num_blocks - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return 1 <= n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Takes `n` blocks, lowest ids first; raises OutOfBlocks and takes none if short."""
        if n < 1:
            raise ValueError(f"must allocate at least one block, got {n}")
        if n > len(self._free):
            raise OutOfBlocks(f"need {n} blocks, {len(self._free)} of {self._num_blocks} free")
        blocks = [heapq.heappop(self._free) for _ in range(n)]
        for block in blocks:
            self._allocated[block] = 1
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        """Returns blocks to the free list; all-or-nothing, so a bad id frees none."""
        seen: set[int] = set()
        for block in blocks:
            if not 0 <= block < self._num_blocks:
                raise ValueError(f"block {block} is outside [0, {self._num_blocks})")
            if not self._allocated[block] or block in seen:
                raise ValueError(f"block {block} is not allocated (double free?)")
            seen.add(block)
        for block in blocks:
            self._allocated[block] = 0
            heapq.heappush(self._free, block)
