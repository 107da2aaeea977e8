"""DGFM's cycle search and swap plan: 2-cycles (which the paper's undirected test misses),
3-cycles, nested cycles, none (a chain, a diamond); swaps leave every node's usage as it
was and cancel every debt cycle above the minimum swap size."""

from __future__ import annotations

import collections
import itertools

from hypothesis import given
from hypothesis import strategies as st

from attnstore.debt_graph import Swap, find_cycle, plan_swaps


def rotations(cycle: list[str]) -> set[tuple[str, ...]]:
    return {tuple(cycle[i:] + cycle[:i]) for i in range(len(cycle))}


def test_two_cycle_is_found() -> None:
    assert tuple(find_cycle({("a", "b"): 5, ("b", "a"): 3})) in rotations(["a", "b"])


def test_three_cycle_is_found() -> None:
    debts = {("a", "b"): 1, ("b", "c"): 1, ("c", "a"): 1, ("c", "d"): 4}
    assert tuple(find_cycle(debts)) in rotations(["a", "b", "c"])


def test_no_cycle_in_chains_diamonds_and_zero_edges() -> None:
    assert find_cycle({("a", "b"): 1, ("b", "c"): 1, ("a", "c"): 1}) is None
    assert find_cycle({("a", "b"): 1, ("a", "c"): 1, ("b", "d"): 1, ("c", "d"): 1}) is None
    assert find_cycle({("a", "b"): 1, ("b", "a"): 0}) is None
    assert find_cycle({}) is None


def test_swap_sizes_follow_the_smallest_edge_and_the_minimum() -> None:
    assert plan_swaps({("a", "b"): 5, ("b", "a"): 3}, min_swap_bytes=1) == [Swap(("a", "b"), 3)]
    assert plan_swaps({("a", "b"): 5, ("b", "a"): 3}, min_swap_bytes=4) == []
    [swap] = plan_swaps({("a", "b"): 4, ("b", "c"): 6, ("c", "a"): 9}, min_swap_bytes=1)
    assert swap.size_bytes == 4 and set(swap.moves()) == {("a", "b", 4), ("b", "c", 4), ("c", "a", 4)}


def usage(debts: dict) -> collections.Counter[str]:
    """Bytes each node holds for others minus what others hold for it."""
    held: collections.Counter[str] = collections.Counter()
    for (debtor, creditor), size in debts.items():
        held[creditor] += size
        held[debtor] -= size
    return held


@given(st.dictionaries(st.tuples(st.sampled_from("abcde"), st.sampled_from("abcde")), st.integers(0, 50), max_size=20),
       st.integers(1, 10))  # fmt: skip
def test_swaps_keep_usage_and_leave_no_cycle_above_the_minimum(debts: dict, min_swap: int) -> None:
    debts = {edge: size for edge, size in debts.items() if edge[0] != edge[1]}
    after = dict(debts)
    for swap in plan_swaps(debts, min_swap):
        assert swap.size_bytes >= min_swap
        for owner, holder, size in swap.moves():
            after[(owner, holder)] -= size
            assert after[(owner, holder)] >= 0
    assert usage(after) == usage(debts)  # Counters: a missing node counts as 0
    assert find_cycle({edge: size for edge, size in after.items() if size >= min_swap}) is None


def test_a_long_chain_does_not_recurse() -> None:
    nodes = [f"n{i}" for i in range(5000)]
    debts = {(a, b): 1 for a, b in itertools.pairwise(nodes)}
    assert find_cycle(debts) is None
    debts[(nodes[-1], nodes[0])] = 1
    assert len(find_cycle(debts)) == 5000
