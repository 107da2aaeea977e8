"""The issue's calibration policy, for one tier in process (calibration.py): a hit density
learned per class of chunk, evicting the lowest expected hits per chunk-second at its
idle age (after LHD, Beckmann et al., NSDI'18), a chain's deepest chunk first.

What sets it apart from the daemon's predictive order (kvstore_daemon/hit_density.py,
chunk_lives.py), each worth points of the gap in a dev variant (docs/benchmarks.md):

- it learns from every key a lookup names, stored or not: the gap since the key was last
  named or stored, however the store treated it, so its counts are not censored by its
  own evictions (the daemon learns from its chunks' lives and a bounded ghost list);
- the class is how often lookups named the key so far (0, 1, 2 or more; across lives,
  misses included: a chunk stored after its own lookup missed is in class 1, one named
  by an earlier request too in class 2), not the reads of the current life;
- ages are seconds of the schedule, not ticks of store events.

A spell starts when a key is stored or named and ends at the next naming (a hit at that
age) or, unnamed for `HORIZON_S`, as a spell that was not reused. The density of a class
at age a is P(named beyond a) / E[wait beyond a | named beyond a], MIN's expected next use
as hits per second. A victim is the lowest density of 64 resident keys drawn at
random (the deepest among ties), then its deepest resident descendant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from bench.hitrate.residents import Residents

Key = Hashable
BIN_S = 5.0
HORIZON_S = 300.0  # a spell unnamed this long counts as not reused (6.3% of the reuses in Mooncake's 10 minutes come later; median 81 s)
BINS = int(HORIZON_S / BIN_S)
RECOMPUTE_ENDS = 2000  # spells ended between two recomputations of the densities
MIN_CLASS_ENDS = 50  # below, a class is ranked by every class's counts pooled
CLASSES = 3  # named 0, 1, 2 or more times


class LearnedDensity:
    def __init__(self, seed: int = 0) -> None:
        self.now = 0.0  # the schedule's clock, set by the caller
        self._hits: dict[int, list[float]] = {}  # class -> reads per age bin
        self._unread: dict[int, float] = {}  # class -> spells that ended unread
        self._tables: dict[int, list[float]] = {}
        self._pooled = [0.0] * BINS
        self._ended = 0
        self._named: dict[Key, int] = {}  # key -> lookups that named it
        self._spell: dict[Key, tuple[float, int]] = {}  # key -> (start, class) of its open spell
        self._opened: deque[tuple[float, Key]] = deque()  # spells by start, to end them past the horizon
        self._residents = Residents(seed)
        self._last: dict[Key, tuple[float, int]] = {}  # resident key -> (start, class) of its latest spell

    # ---- learning --------------------------------------------------------------

    def named(self, key: Key) -> None:
        """A lookup named the key (whether or not the store held it)."""
        spell = self._spell.get(key)
        if spell is not None:
            age = self.now - spell[0]
            counts = self._hits.setdefault(spell[1], [0.0] * BINS)
            counts[int(age // BIN_S)] += 1.0
            self._ended += 1
        self._named[key] = self._named.get(key, 0) + 1
        self._start(key)

    def _start(self, key: Key) -> None:
        spell = self._spell[key] = (self.now, min(self._named.get(key, 0), CLASSES - 1))
        self._opened.append((self.now, key))
        if key in self._residents:
            self._last[key] = spell

    def advance(self) -> None:
        """Ends the spells unnamed for the horizon; recomputes the densities when due."""
        while self._opened and self.now - self._opened[0][0] >= HORIZON_S:
            start, key = self._opened.popleft()
            spell = self._spell.get(key)
            if spell is not None and spell[0] == start:
                del self._spell[key]
                self._unread[spell[1]] = self._unread.get(spell[1], 0.0) + 1.0
                self._ended += 1
        if self._ended >= RECOMPUTE_ENDS or not self._tables:
            self._ended = 0
            self._recompute()

    def _recompute(self) -> None:
        classes = set(self._hits) | set(self._unread)
        pooled = [sum(self._hits.get(c, [0.0] * BINS)[b] for c in classes) for b in range(BINS)]
        self._pooled = _densities(pooled, sum(self._unread.values()))
        self._tables = {}
        for cls in classes:
            hits, unread = self._hits.get(cls, [0.0] * BINS), self._unread.get(cls, 0.0)
            if sum(hits) + unread >= MIN_CLASS_ENDS:
                self._tables[cls] = _densities(hits, unread)

    def density(self, key: Key) -> float:
        start, cls = self._last[key]
        return self._tables.get(cls, self._pooled)[min(int((self.now - start) // BIN_S), BINS - 1)]

    # ---- the store's calls -----------------------------------------------------

    def stored(self, key: Key, depth: int) -> None:
        """The key entered the store at `depth` of its chain: a spell starts."""
        self._residents.add(key, depth)
        self._start(key)

    def removed(self, key: Key) -> None:
        del self._last[key]
        self._residents.remove(key)

    def victim(self, children: dict[Key, set[Key]]) -> Key:
        return self._residents.victim(self.density, children)


def _densities(hits: list[float], unread: float) -> list[float]:
    """Per age bin, from the oldest down: P(named beyond the bin) / the mean wait."""
    table = [0.0] * BINS
    reads = read_ages = 0.0
    for b in range(BINS - 1, -1, -1):
        reads += hits[b]
        read_ages += hits[b] * (b + 0.5)
        wait = (read_ages - reads * b) * BIN_S
        table[b] = reads / (reads + unread) * reads / wait if wait > 0 else 0.0
    return table
