"""The offline optimum of a schedule of prefix-chained chunk lookups and stores.

A schedule is what a replay did, in order: a turn *looks up* its prompt's chain of chunk
keys, root first, when it starts (it hits the longest stored prefix) and *offers* the
chunks it computed when it ends (the store may keep any of them). The store may also keep
any chunk of a chain right after looking it up (as if a turn's KV were saved the moment
it was looked up: the real save comes at the turn's end, so this bounds every real store
from above). The optimum is the most hit chunks a store of `capacity_chunks` could serve
on that schedule, knowing all of it in advance.

It is Belady's MIN with two rules for chained keys: the store may decline a chunk (when it
would be used later than everything it holds), and among chunks whose next use is the same
lookup it evicts the deepest. A chunk's key chains its parent's, so a parent is never used
later than its child: keeping the nearest-used chunks keeps every held chain prefix-closed,
every held chunk that a lookup names is then a hit, and MIN's count is the optimum of plain
caching with bypass, which bounds the prefix-limited one. Without the depth rule MIN may
keep a child whose parent it evicted and count hits no store can serve. On schedules of
lookups alone this equals exhaustive search on small random prefix trees
(tests/unit/bench/test_optimal_hitrate.py). With answers stored at a turn's end (a chunk
offered before its first lookup) MIN's choices remain a valid store but not always the
best: in a few of 4,000 random small schedules it fell one chunk short of exhaustive
search (8 vs 9 hits at 4 chunks of room), so the reported optimum may sit a hair below
the true one, never above what a store could do on the relaxed schedule.

bench-hitrate runs it with `admit_on_lookup=False` on each replay's schedule (chunks enter
only when a turn stores them, the whole turn's chain offered whatever the policy hit, so
one schedule serves every policy): never above the store that never evicts, and reported
beside every policy as the share of the LRU-to-optimum gap it closes.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

Key = Hashable
Chain = tuple[Key, ...]
NEVER = float("inf")
_Rank = tuple[float, int]  # (next use, depth): the larger, the better to evict


@dataclass(frozen=True)
class Lookup:
    chain: Chain  # the prompt's chunk keys, root first


@dataclass(frozen=True)
class Offer:
    chunks: tuple[tuple[Key, int], ...]  # (key, depth in its chain): what a finished turn computed


Event = Lookup | Offer


def optimal_hits(schedule: Sequence[Event], capacity_chunks: int, *, admit_on_lookup: bool = True) -> int:
    """Hit chunks of the offline-optimal store on `schedule` (see the module doc).
    `admit_on_lookup` False: chunks enter only when offered, as in a real store (then the
    result never exceeds a store that never evicts, but MIN may fall short of the best)."""
    return optimal_hits_by_prefix(
        schedule, capacity_chunks, [len(schedule)], admit_on_lookup=admit_on_lookup
    )[0]


def optimal_hits_by_prefix(
    schedule: Sequence[Event], capacity_chunks: int, ends: Sequence[int], *, admit_on_lookup: bool = True
) -> list[int]:
    """`optimal_hits(schedule[:end], ...)` for each of the ascending `ends`, in one pass over
    the whole schedule: MIN run on it makes, among the chunks used before `end`, the choices
    it makes on `schedule[:end]` (whatever is next used at or after `end` ranks behind all of
    them, as it does there unused), so its hits before `end` are that prefix's optimum."""
    uses = _lookup_times(schedule)
    held: dict[Key, _Rank] = {}
    # Max-heap by rank with lazy deletion: an entry whose rank is no longer its key's is skipped.
    heap: list[tuple[float, int, int, Key]] = []
    hits = 0
    at_ends: list[int] = []
    for time, event in enumerate(schedule):
        while len(at_ends) < len(ends) and ends[len(at_ends)] <= time:
            at_ends.append(hits)
        if isinstance(event, Lookup):
            for key in event.chain:
                if key not in held:
                    break
                hits += 1
            chunks: Sequence[tuple[Key, int]] = [
                (key, depth) for depth, key in enumerate(event.chain) if admit_on_lookup or key in held
            ]
        else:
            chunks = event.chunks
        for key, depth in chunks:
            rank = (_next_use(uses, key, time), depth)
            if key not in held:
                if rank[0] == NEVER:
                    continue
                if len(held) >= capacity_chunks:
                    victim = _farthest(heap, held)
                    if victim is None or rank >= held[victim]:  # nothing held is used later: decline
                        continue
                    del held[victim]
            held[key] = rank
            heapq.heappush(heap, (-rank[0], -depth, time, key))
    return at_ends + [hits] * (len(ends) - len(at_ends))


def _lookup_times(schedule: Sequence[Event]) -> dict[Key, list[int]]:
    times: dict[Key, list[int]] = {}
    for time, event in enumerate(schedule):
        if isinstance(event, Lookup):
            for key in event.chain:
                times.setdefault(key, []).append(time)
    return times


def _next_use(uses: dict[Key, list[int]], key: Key, after: int) -> float:
    times = uses.get(key, [])
    index = bisect.bisect_right(times, after)
    return times[index] if index < len(times) else NEVER


def _farthest(heap: list[tuple[float, int, int, Key]], held: dict[Key, _Rank]) -> Key | None:
    """The held chunk used last (deepest among ties), or None when nothing is held."""
    while heap:
        negative_use, negative_depth, _, key = heap[0]
        if held.get(key) == (-negative_use, -negative_depth):
            return key
        heapq.heappop(heap)  # evicted, or re-ranked since
    return None
