"""Learned hit density: how many hits per tick of room a chunk of some class can still
expect, given how long it has sat idle (after LHD, Beckmann et al., NSDI'18).

Per class of chunk the learner counts, by idle age (in ticks of the store's events:
writes and reads, never the wall clock, so a replay on a simulated clock learns the
same thing), the reads that ended an idle spell (`hit`), and the idle spells that ended
unread (`evicted`). A chunk of that class idle for `age` is read again with probability

    P(age) = reads beyond age / (reads beyond age + spells that ended unread)

(a chunk never read again stays "beyond" every age), after E[read age - age | read
beyond age] more ticks; its density is P / that wait: MIN's expected next use, turned
into hits per tick, per class. Evicting the lowest density first keeps what pays most
per tick of room. (LHD proper divides by the expected ticks left in the cache, unread
spells included. In a single-tier replay of Mooncake's first 10 minutes with the chains
known, at 5.5%, 11% and 22% of the working set, LHD's form closed 14%, 10% and -9% of
the LRU-to-optimum gap, this form 10%, 22% and 2%.)

The counts must not be censored by the policy itself: a store that evicts at age 100
would never see a read at age 200. So the caller reports an evicted chunk that was
stored again later (it was needed) as a read at that age, taking back its unread record
(`evicted(undo_from=...)`): chunk_lives.py keeps such ghosts.

Ages are binned geometrically (25% wider each, from `FIRST_BIN_TICKS`), which covers every
store size without tuning a coarsening as LHD does. Counts halve every
`half_life_events` recorded ends, so the learner follows a workload that changes.
"""

from __future__ import annotations

import bisect

FIRST_BIN_TICKS = 8.0
GROWTH = 1.25
AGE_BINS = 64  # up to ~8 x 1.25^63, about 10^7 ticks; older ages share the last bin
_EDGES = tuple(FIRST_BIN_TICKS * GROWTH**i for i in range(AGE_BINS - 1))
_LOWS = (0.0, *_EDGES)
_MIDS = tuple((low + high) / 2 for low, high in zip(_LOWS, (*_EDGES, _EDGES[-1] * GROWTH), strict=True))
DEFAULT_HALF_LIFE_EVENTS = 1 << 16  # ends recorded between two halvings of the counts
# A class's densities are recomputed once its ends since the last time reach this share
# of all it has recorded: exact while it has learned little, cheap once it has learned a lot.
RECOMPUTE_SHARE = 1 / 64
# A class is ranked by its own counts once it has recorded this many ends; before, by all
# classes' counts pooled (one read must not set a class apart: the scheduler's order decides).
# A cold store learns faster pooled longer: in the one-tier model of Mooncake's first 10
# minutes (queued, 9% to 13% of the working set) 256 closed 19.2% of the gap on average,
# 64 15.0%, 1,024 19.4%, 4,096 15.3%; warm (the hour's later windows) they are equal.
MIN_CLASS_ENDS = 256


def age_bin(age_ticks: float) -> int:
    return bisect.bisect_right(_EDGES, age_ticks)


class HitDensity:
    def __init__(self, classes: int, half_life_events: int = DEFAULT_HALF_LIFE_EVENTS) -> None:
        if classes < 1 or half_life_events < 1:
            raise ValueError("classes and half_life_events must be positive")
        self._classes = classes
        # Row `classes` pools every class's counts.
        self._hits = [[0.0] * AGE_BINS for _ in range(classes + 1)]
        self._unread = [0.0] * (classes + 1)  # spells that ended unread, whatever their age
        self._half_life = half_life_events
        self._since_decay = 0
        self.epoch = 0  # halvings so far: a count recorded at epoch e weighs 0.5 ** (epoch - e) now
        self._ends = [0.0] * (classes + 1)  # ends recorded per class
        self._pending = [0.0] * (classes + 1)  # of them, since its densities were computed
        self._table = [[0.0] * AGE_BINS for _ in range(classes + 1)]  # density per class and bin

    def hit(self, cls: int, age_ticks: float) -> None:
        """A chunk of `cls` idle for `age_ticks` was read (or needed again)."""
        for row in (cls, self._classes):
            self._hits[row][age_bin(age_ticks)] += 1.0
            self._ended(row)

    def evicted(self, cls: int, undo_from: int | None = None) -> None:
        """A chunk of `cls` left the tier unread; with `undo_from`, such a record made at that
        epoch is taken back (it was needed after all) at what it weighs now: taken back
        whole after the counts halved, it would leave the class fewer unread ends than it
        had (negative, for a class that rarely ends unread), and its chunks would rank as
        always read again."""
        change = 1.0 if undo_from is None else -(0.5 ** (self.epoch - undo_from))
        for row in (cls, self._classes):
            self._unread[row] += change
            self._ended(row)

    def _ended(self, row: int) -> None:
        self._ends[row] += 1
        self._pending[row] += 1
        if row < self._classes:
            return
        self._since_decay += 1
        if self._since_decay >= self._half_life:
            self._since_decay = 0
            self.epoch += 1
            self._unread = [count / 2 for count in self._unread]
            self._ends = [count / 2 for count in self._ends]
            for counts in self._hits:
                counts[:] = [count / 2 for count in counts]

    def density(self, cls: int, age_ticks: float) -> float:
        """Expected hits per tick for a chunk of `cls` idle `age_ticks` so far."""
        row = cls if self._ends[cls] >= MIN_CLASS_ENDS else self._classes
        if self._pending[row] and self._pending[row] >= self._ends[row] * RECOMPUTE_SHARE:
            self._pending[row] = 0
            self._table[row] = self._densities(self._hits[row], self._unread[row])
        return self._table[row][age_bin(age_ticks)]

    @staticmethod
    def _densities(hits: list[float], unread: float) -> list[float]:
        """From the oldest bin down: P(read beyond the bin's lower edge) / the mean wait."""
        table = [0.0] * AGE_BINS
        reads = read_ages = 0.0  # reads beyond the bin, and the sum of their ages
        for b in range(AGE_BINS - 1, -1, -1):
            reads += hits[b]
            read_ages += hits[b] * _MIDS[b]
            wait = read_ages - reads * _LOWS[b]
            table[b] = reads / (reads + max(unread, 0.0)) * reads / wait if wait > 0 else 0.0
        return table
