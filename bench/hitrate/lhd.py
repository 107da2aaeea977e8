"""The issue's calibration policy as literally as it states it, for one tier in process
(calibration.py): LHD (Beckmann et al., NSDI'18). Per class of chunk (read in its current
life or not, and its depth in the chain) and coarse idle-age bin, a chunk's life ends in a
hit (it was read at that age) or an eviction (at that age). The hit density of a class at
age a is the hits it can still expect over the room it will still hold:

    density(a) = sum_{x >= a} hits(x) / sum_{x >= a} sum_{y >= x} (hits(y) + evictions(y))

(P(hit beyond a) / E[remaining lifetime in chunk-seconds], chunks being one size). The
counters decay every `DECAY_EVENTS` ends, when the densities are recomputed. A victim is
the lowest density of 64 resident chunks drawn at random (the deepest among ties),
then its deepest resident descendant, so that prefixes stay whole.

Unlike learned_density.py it learns only from its own chunks' lives (censored by its own
evictions, as LHD is), and counts evictions into the lifetime.
"""

from __future__ import annotations

from collections.abc import Hashable

from bench.hitrate.residents import Residents

Key = Hashable
BIN_S = 5.0
BINS = 120  # ages beyond 10 minutes share the last bin
DECAY_EVENTS = 4000  # ends between two recomputations; the counters then decay
DECAY = 0.9
DEPTH_EDGES = (4, 16, 64)  # depth classes: below 4, 16, 64, and deeper


class LHD:
    def __init__(self, seed: int = 0) -> None:
        self.now = 0.0  # the schedule's clock, set by the caller
        classes = 2 * (len(DEPTH_EDGES) + 1)
        self._hits = [[0.0] * BINS for _ in range(classes)]
        self._evictions = [[0.0] * BINS for _ in range(classes)]
        self._table: list[list[float]] | None = None  # None: LRU until the first recompute
        self._ends = 0
        self._residents = Residents(seed)
        self._since: dict[Key, float] = {}  # resident key -> its last access (store or hit)
        self._read: set[Key] = set()  # resident keys read in their current life

    def _class(self, key: Key) -> int:
        depth = sum(self._residents.depth[key] >= edge for edge in DEPTH_EDGES)
        return 2 * depth + (key in self._read)

    def _bin(self, key: Key) -> int:
        return min(int((self.now - self._since[key]) // BIN_S), BINS - 1)

    def _ended(self, counts: list[list[float]], key: Key) -> None:
        counts[self._class(key)][self._bin(key)] += 1.0
        self._ends += 1
        if self._ends >= DECAY_EVENTS:
            self._ends = 0
            self._table = [_densities(h, e) for h, e in zip(self._hits, self._evictions, strict=True)]
            for row in self._hits + self._evictions:
                row[:] = [count * DECAY for count in row]

    # ---- the store's calls -----------------------------------------------------

    def hit(self, key: Key) -> None:
        self._ended(self._hits, key)
        self._read.add(key)
        self._since[key] = self.now

    def stored(self, key: Key, depth: int) -> None:
        self._residents.add(key, depth)
        self._since[key] = self.now

    def removed(self, key: Key) -> None:
        self._ended(self._evictions, key)
        del self._since[key]
        self._read.discard(key)
        self._residents.remove(key)

    def density(self, key: Key) -> float:
        if self._table is None:
            return -(self.now - self._since[key])
        return self._table[self._class(key)][self._bin(key)]

    def victim(self, children: dict[Key, set[Key]]) -> Key:
        return self._residents.victim(self.density, children)


def _densities(hits: list[float], evictions: list[float]) -> list[float]:
    """LHD's reconfiguration: from the oldest bin down, hits beyond over lifetime beyond."""
    table = [0.0] * BINS
    later_hits = later_ends = lifetime = 0.0
    for b in range(BINS - 1, -1, -1):
        later_hits += hits[b]
        later_ends += hits[b] + evictions[b]
        lifetime += later_ends
        table[b] = later_hits / lifetime if lifetime > 0 else 0.0
    return table
