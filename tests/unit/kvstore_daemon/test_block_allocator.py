"""BlockAllocator: no block is ever handed out twice, and counts are conserved."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnstore.errors import ResourceExhausted
from kvstore_daemon.block_allocator import BlockAllocator, OutOfBlocks


def test_allocates_lowest_ids_first_and_reuses_freed_ones() -> None:
    allocator = BlockAllocator(8)
    assert allocator.allocate(3) == [0, 1, 2]
    assert allocator.allocate(2) == [3, 4]
    allocator.free([1, 0])
    assert allocator.allocate(3) == [0, 1, 5]
    assert (allocator.free_count, allocator.used_count) == (2, 6)


def test_out_of_blocks_takes_nothing_and_maps_to_resource_exhausted() -> None:
    allocator = BlockAllocator(4)
    allocator.allocate(3)
    assert not allocator.can_allocate(2)
    with pytest.raises(OutOfBlocks) as error:
        allocator.allocate(2)
    assert isinstance(error.value, ResourceExhausted)
    assert allocator.free_count == 1
    assert allocator.allocate(1) == [3]


def test_rejects_non_positive_requests() -> None:
    allocator = BlockAllocator(4)
    assert not allocator.can_allocate(0)
    with pytest.raises(ValueError):
        allocator.allocate(0)
    with pytest.raises(ValueError):
        BlockAllocator(0)


@pytest.mark.parametrize("bad", [[7], [-1], [0, 0], [0, 5]])
def test_bad_free_raises_and_frees_nothing(bad: list[int]) -> None:
    allocator = BlockAllocator(6)
    allocator.allocate(2)  # blocks 0 and 1
    with pytest.raises(ValueError):
        allocator.free(bad)
    assert allocator.used_count == 2
    allocator.free([0, 1])
    with pytest.raises(ValueError):
        allocator.free([0])  # double free


# Each op: ("alloc", n) or ("free", index into the list of live allocations).
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 12)),
        st.tuples(st.just("free"), st.integers(0, 1_000)),
    ),
    max_size=60,
)


@given(num_blocks=st.integers(1, 40), ops=_ops)
def test_never_hands_out_a_block_twice_and_conserves_counts(
    num_blocks: int, ops: list[tuple[str, int]]
) -> None:
    allocator = BlockAllocator(num_blocks)
    live: list[list[int]] = []
    held: set[int] = set()
    for op, arg in ops:
        if op == "alloc":
            if allocator.can_allocate(arg):
                blocks = allocator.allocate(arg)
                assert len(blocks) == arg
                assert held.isdisjoint(blocks) and len(set(blocks)) == arg
                assert all(0 <= b < num_blocks for b in blocks)
                held.update(blocks)
                live.append(blocks)
            else:
                assert arg > num_blocks - len(held)
                with pytest.raises(OutOfBlocks):
                    allocator.allocate(arg)
        elif live:
            blocks = live.pop(arg % len(live))
            allocator.free(blocks)
            held.difference_update(blocks)
        assert allocator.used_count == len(held)
        assert allocator.free_count + allocator.used_count == num_blocks
    for blocks in live:
        allocator.free(blocks)
    assert allocator.free_count == num_blocks
    assert sorted(allocator.allocate(num_blocks)) == list(range(num_blocks))
