"""The pooled replay's workload and sizing: ShareGPT sessions on a simulated clock, dealt
to three nodes, and the capacity of a node.

Sessions: bench/hitrate/workloads.py's ShareGPT sessions (real conversations, 256-token
chunks of 8 KiB; sessions arrive as a Poisson process, a turn's successor arrives its
service time plus an exponential think time later).

Working set: many chunks are never read again (a session's last answer, sessions that
ended), so "every chunk stored" overstates what a store must hold. The working set here is
the smallest capacity at which one LRU store serves WORKING_SET_HIT_SHARE of the hits a
store that never evicts would, on the same schedule (an LRU simulation of it, in chunks).
The pool holds POOL_MARGIN times that; each node a third of the pool.

Routing: the scheduler's affinity keeps each session on one node; sessions are dealt with
weights 8:1:1 (seeded): the busy node carries four fifths of the sessions, as in
Infinite-LLM's skewed load (one instance's long contexts, the others' memory idle), while
the others have room to lend. The skew sets what a pool can gain at all: by the same LRU
simulation one store with the three nodes' capacity serves 0.994 of the hits, three LRU
islands 0.874 at 4:1:1 (1.14x to gain), 0.774 at 8:1:1 (1.29x) and 0.734 at 12:1:1
(1.36x); with shares as even as 3:2:1 an island loses almost nothing (98-99%). The last
session dealt 4:1:1, where even a perfect pool could not be "well above" the islands.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict
from dataclasses import dataclass

from bench.hitrate.workloads import Workload

NODE_WEIGHTS = (8, 1, 1)
POOL_MARGIN = 1.1
WORKING_SET_HIT_SHARE = 0.98
ARRIVAL, COMPLETION = 0, 1
Event = tuple[float, int, int, int]  # (time, ARRIVAL | COMPLETION, session, turn)


@dataclass(frozen=True)
class Sizing:
    working_set_chunks: int
    node_chunks: int


def events(workload: Workload) -> list[Event]:
    """Every turn's arrival and completion, in the clock's order."""
    heap: list[Event] = []
    for number, session in enumerate(workload.sessions):
        now = session.arrival_s
        for index, turn in enumerate(session.turns):
            now += turn.think_s
            heap.append((now, ARRIVAL, number, index))
            now += turn.service_s
            heap.append((now, COMPLETION, number, index))
    heapq.heapify(heap)
    return [heapq.heappop(heap) for _ in range(len(heap))]


def wanted_keys(workload: Workload, number: int, index: int) -> tuple[bytes, ...]:
    """The prompt chunks of turn `index` that an earlier turn of its session stored."""
    session = workload.sessions[number]
    if index == 0:
        return ()
    turn = session.turns[index]
    return turn.keys[: min(turn.prompt_blocks, len(session.turns[index - 1].keys))]


def deal(workload: Workload, seed: int) -> list[int]:
    """Each session's node."""
    rng = random.Random(seed)
    return [rng.choices(range(len(NODE_WEIGHTS)), NODE_WEIGHTS)[0] for _ in workload.sessions]


def lru_hit_share(workload: Workload, schedule: list[Event], capacity_chunks: int) -> float:
    """Hits of one LRU store of `capacity_chunks` over those of a store that never evicts."""
    held: OrderedDict[bytes, None] = OrderedDict()
    wanted = found = 0
    for _, kind, number, index in schedule:
        if kind == ARRIVAL:
            keys = wanted_keys(workload, number, index)
            wanted += len(keys)
            for key in keys:
                if key not in held:
                    break
                held.move_to_end(key)
                found += 1
            continue
        for key in workload.sessions[number].turns[index].keys:
            held[key] = None
            held.move_to_end(key)
            while len(held) > capacity_chunks:
                held.popitem(last=False)
    return found / wanted if wanted else 1.0


def size_nodes(workload: Workload, schedule: list[Event]) -> Sizing:
    """The working set (bisection over LRU capacities) and a node's third of the pool."""
    low, high = 1, len({key for s in workload.sessions for t in s.turns for key in t.keys})
    while low < high:
        middle = (low + high) // 2
        if lru_hit_share(workload, schedule, middle) >= WORKING_SET_HIT_SHARE:
            high = middle
        else:
            low = middle + 1
    return Sizing(low, math.ceil(low * POOL_MARGIN / len(NODE_WEIGHTS)))
