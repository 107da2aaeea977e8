"""A simulation of KV blocks drifting away from home, with and without DGFM.

Three nodes of `capacity` blocks each; each node's own demand rises and falls out of
phase with the others (long sequences growing while its peers' shrink). A node places a
new block at home while it has room, else on the peer with the most room (the pool's
borrowing). A shrinking node frees blocks of its own, wherever they are, at random: a block that went out at a peak stays out as long as its
sequence lives, and meanwhile the peers' peaks borrow the room it left at home. With DGFM, every `period` steps the
debt graph's cycles are swapped home (attnstore.debt_graph), the blocks in flight frozen
for that step (not freed, not moved again). Reported: the remote share of blocks per step.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from attnstore.debt_graph import plan_swaps


@dataclass
class Block:
    owner: int
    place: int
    born: int
    frozen_until: int = -1


@dataclass
class Cluster:
    nodes: int
    capacity: int
    rng: random.Random
    blocks: list[Block] = field(default_factory=list)
    moved: int = 0

    def used(self, node: int) -> int:
        return sum(b.place == node for b in self.blocks)

    def own(self, node: int) -> list[Block]:
        return [b for b in self.blocks if b.owner == node]

    def grow(self, node: int, step: int) -> bool:
        free = {n: self.capacity - self.used(n) for n in range(self.nodes)}
        place = node if free[node] > 0 else max(free, key=lambda n: (free[n], -n))
        if free[place] <= 0:
            return False
        self.blocks.append(Block(node, place, step))
        return True

    def shrink(self, node: int, step: int) -> None:
        movable = [b for b in self.own(node) if b.frozen_until < step]
        if movable:
            self.blocks.remove(self.rng.choice(movable))

    def remote_share(self) -> float:
        return sum(b.owner != b.place for b in self.blocks) / max(1, len(self.blocks))

    def defragment(self, step: int, min_swap_blocks: int) -> None:
        debts: dict[tuple[str, str], int] = {}
        for b in self.blocks:
            if b.owner != b.place and b.frozen_until < step:
                edge = (str(b.owner), str(b.place))
                debts[edge] = debts.get(edge, 0) + 1
        for swap in plan_swaps(debts, min_swap_blocks):
            for owner, holder, count in swap.moves():
                away = [
                    b
                    for b in self.blocks
                    if b.owner == int(owner) and b.place == int(holder) and b.frozen_until < step
                ]
                for b in away[:count]:  # the oldest first: they would stay out longest
                    b.place, b.frozen_until = b.owner, step
                    self.moved += 1


def demand(node: int, nodes: int, step: int, capacity: int, period_steps: int) -> int:
    phase = 2 * math.pi * (step / period_steps + node / nodes)
    return int(capacity * (0.75 + 0.45 * math.sin(phase)))


def simulate(
    steps: int = 600, nodes: int = 3, capacity: int = 100, dgfm_every: int | None = 10,
    period_steps: int = 120, min_swap_blocks: int = 2, seed: int = 0,
) -> list[float]:  # fmt: skip
    """The remote share of blocks after each step."""
    cluster = Cluster(nodes, capacity, random.Random(seed))
    shares = []
    for step in range(steps):
        for node in range(nodes):
            target, have = demand(node, nodes, step, capacity, period_steps), len(cluster.own(node))
            for _ in range(max(0, target - have)):
                if not cluster.grow(node, step):
                    break
            for _ in range(max(0, have - target)):
                cluster.shrink(node, step)
        if dgfm_every is not None and step % dgfm_every == 0:
            cluster.defragment(step, min_swap_blocks)
        shares.append(cluster.remote_share())
    return shares


def forced_share(steps: int = 600, nodes: int = 3, capacity: int = 100, period_steps: int = 120) -> float:
    """The mean share of blocks that must be remote (demand beyond a node's capacity):
    the floor any placement reaches."""
    shares = []
    for step in range(steps):
        wants = [demand(n, nodes, step, capacity, period_steps) for n in range(nodes)]
        shares.append(sum(max(0, w - capacity) for w in wants) / max(1, sum(wants)))
    return sum(shares) / len(shares)


def per_period(shares: list[float], period_steps: int = 120) -> list[float]:
    return [round(sum(shares[i : i + period_steps]) / len(shares[i : i + period_steps]), 4)
            for i in range(0, len(shares), period_steps)]  # fmt: skip
