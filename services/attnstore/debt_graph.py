"""Debt-graph defragmentation (DGFM, Infinite-LLM): nodes lend and borrow KV memory at
once, so a sequence's blocks drift away from home; where debts form a cycle, blocks can go
home with no node's usage changing.

The graph has an edge debtor -> creditor weighted by the bytes of the debtor's KV the
creditor holds (pool_debts.read_debts). Around a cycle A -> B -> C -> A, moving m
bytes of each debtor's KV from its creditor back home frees m on every creditor and takes
m on every debtor: every node holds what it held, and 3m bytes fewer are remote. m is the
cycle's smallest edge, so each swap removes at least one edge and the loop ends.

Cycles are found by a depth-first search with white/grey/black colours: an edge into a
grey node (on the current path) closes a cycle. The paper's Algorithm 1 is the undirected
test (a visited neighbour other than the parent), which cannot see A -> B -> A.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Edge = tuple[str, str]  # (debtor, creditor)

_WHITE, _GREY, _BLACK = 0, 1, 2


@dataclass(frozen=True)
class Swap:
    """Move `size_bytes` of each cycle member's KV from its creditor back home."""

    cycle: tuple[str, ...]  # debtors in order: cycle[i] owes cycle[i + 1] (the last owes the first)
    size_bytes: int

    def moves(self) -> list[tuple[str, str, int]]:
        """(owner, from_node, bytes): every debtor's KV recalled from its creditor."""
        n = len(self.cycle)
        return [(self.cycle[i], self.cycle[(i + 1) % n], self.size_bytes) for i in range(n)]


def find_cycle(debts: Mapping[Edge, int]) -> list[str] | None:
    """A directed cycle of nodes (each owes the next, the last the first), or None."""
    graph: dict[str, list[str]] = {}
    for (debtor, creditor), size in sorted(debts.items()):
        if size > 0 and debtor != creditor:
            graph.setdefault(debtor, []).append(creditor)
            graph.setdefault(creditor, [])
    colour = dict.fromkeys(graph, _WHITE)
    for root, creditors in graph.items():
        if colour[root] != _WHITE:
            continue
        path, iterators = [root], [iter(creditors)]
        colour[root] = _GREY
        while path:  # iterative: a long chain of debts cannot overflow the stack
            following = next(iterators[-1], None)
            if following is None:
                colour[path.pop()] = _BLACK
                iterators.pop()
            elif colour[following] == _GREY:
                return path[path.index(following) :]
            elif colour[following] == _WHITE:
                colour[following] = _GREY
                path.append(following)
                iterators.append(iter(graph[following]))
    return None


def plan_swaps(debts: Mapping[Edge, int], min_swap_bytes: int) -> list[Swap]:
    """Swaps that cancel every cycle of debts of at least `min_swap_bytes` a step (smaller
    debts are not worth a recall and are left out of the search)."""
    remaining = {edge: size for edge, size in debts.items() if size >= min_swap_bytes}
    swaps = []
    while (cycle := find_cycle(remaining)) is not None:
        edges = [(cycle[i], cycle[(i + 1) % len(cycle)]) for i in range(len(cycle))]
        size = min(remaining[edge] for edge in edges)
        swaps.append(Swap(tuple(cycle), size))
        for edge in edges:
            remaining[edge] -= size
            if remaining[edge] < min_swap_bytes:
                del remaining[edge]
    return swaps
