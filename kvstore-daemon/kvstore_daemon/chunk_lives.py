"""What the predictive policy learns from, shared by the daemon's two tiers: each chunk's
life in the store (from the write that stored it to the eviction that drops its last
copy), the hit-density learner fed by those lives, and the chains chunks form.

A chunk demoted from DRAM to SSD, or promoted back, is the same life: its idle age and
the reads it had go with it, so the SSD tier, which decides what leaves the store,
ranks it as what it is rather than as new. A read is one event however many tiers hold
a copy (the mover reports it to each). Ages are in ticks of store events (a new life or
a read), never the wall clock, so a replay on a simulated clock learns the same thing.

Counts of lives must not be censored by the policy itself: a store that evicts at age
100 would never see a read at age 200. So an evicted chunk is remembered as a ghost (the
latest `ghost_keys_max`): named again by a lookup beyond its stored prefix (`missed`) or
stored again, it was needed again, and its unread end is taken back for a read at that
age (LHD's exploration problem: in a single-tier replay of Mooncake's first 10 minutes,
LHD's form without ghosts ranked below LRU at 5.5%, 11% and 22% of the working set, -1%
to -22% of the LRU-to-optimum gap; with them it closed 2% and 9% at the first two). The
lookups' misses are what lets ghosts last: heard only at a store again, a ghost kept for
4 times the resident count of ticks did best, 16 times lost (the reuse it records comes a
turn's service time late, and never for a chunk the store declines); heard at the miss,
ghosts capped only by count do best (docs/benchmarks.md, "misses").

The class counts how often lookups named the chunk's key before this life (misses and
earlier lives' reads, remembered for the latest `named_keys_max` keys named), plus its
reads in this life: 0, 1, 2, 3 or more. A chunk stored after its own lookup missed is
in class 1; one an earlier request asked for too, in class 2 (after the calibration's
learned density, bench/hitrate/learned_density.py). Counting only this life's reads
told a continuation's new tail from a chunk requests keep asking for only once it was
read; in a one-tier replay of Mooncake's hour on the benchmark's schedule at 11% of
the first 10 minutes' working set, the warm windows' mean share of the LRU-to-optimum
gap rose from 6.5% to 27.4% with the lookups counted. A map that forgets after about
10 minutes of this trace's keys did better warm than a longer one (24.6% at 4x): being
named lately is what predicts (docs/benchmarks.md, "named before"). What the scheduler
last said of a chunk is no part of the class (it orders chunks of equal density,
predictive_policy.py): as a sixfold split of each class (nothing yet, nothing since its
latest predictions, four buckets of predicted seconds) it cost the cold store on the real
daemon (Mooncake's first 10 minutes at 1% / 10%: docs/benchmarks.md, "the scheduler's
word out of the learner's class").

The chains: a lookup's stored prefix and a hinted chain name keys root first, so each
key's parent is known once either has been seen; `children` holds every key's children
alive in the store (a parent outlives them: a chain cut in the middle cannot hit).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore_daemon import metrics
from kvstore_daemon.hit_density import HitDensity

GHOST_KEYS_MAX = (
    1 << 17
)  # evicted keys remembered (about 20 MB): the setting predictive_ghost_keys_max's default
REUSE_CLASSES = 4  # named or read 0, 1, 2, 3 or more times: the learner's classes
NAMED_KEYS_MAX = 1 << 15  # keys whose lookups are counted (about 5 MB): predictive_named_keys_max's default


@dataclass
class Life:
    tick: int  # the store's tick at its last write or read
    touched_at: float  # the clock then
    copies: int = 0  # tiers holding it
    reads: int = 0  # reads in this life
    depth: int = 0  # its place in its hinted chain, when one was hinted
    named: int = 0  # lookups that named its key before this life (misses, earlier lives' reads)

    @property
    def cls(self) -> int:
        return min(self.named + self.reads, REUSE_CLASSES - 1)


class ChunkLives:
    def __init__(
        self,
        clock: Callable[[], float],
        learner: HitDensity | None = None,
        ghost_keys_max: int = GHOST_KEYS_MAX,
        named_keys_max: int = NAMED_KEYS_MAX,
    ) -> None:
        self._clock = clock
        self.learner = learner or HitDensity(REUSE_CLASSES)
        self.tick = 0
        self.lives: dict[bytes, Life] = {}
        self._last_read: tuple[bytes, int] | None = None  # (key, tick after it): a second tier's report
        # evicted key -> (class, last tick, the learner's epoch at its unread end)
        self._ghosts: OrderedDict[bytes, tuple[int, int, int]] = OrderedDict()
        self._ghosts_max = ghost_keys_max
        self._named: OrderedDict[bytes, int] = (
            OrderedDict()
        )  # key -> lookups that named it, latest named last
        self._named_max = named_keys_max
        self.children: dict[bytes, set[bytes]] = {}  # key -> its children alive in the store
        self._parent: dict[bytes, bytes] = {}  # key alive in the store -> its parent
        self.lost_child: list[
            Callable[[bytes], None]
        ] = []  # called with a parent when a child leaves the store
        self.born: list[Callable[[bytes], None]] = []  # called with a key when it enters the store
        self.reread: list[Callable[[bytes], None]] = []  # called with a key when it is read (once per read)

    def copied(self, key: bytes) -> Life:
        """A tier took a copy: a new life unless another tier holds one."""
        life = self.lives.get(key)
        if life is None:
            self._needed_again(key, "store")
            life = self.lives[key] = Life(self.tick, self._clock(), named=self._named.get(key, 0))
            self.tick += 1
            for listener in self.born:
                listener(key)
        life.copies += 1
        return life

    def read(self, key: bytes) -> Life | None:
        """The key was read; the same read reported by a second tier counts once."""
        life = self.lives.get(key)
        if life is None or self._last_read == (key, self.tick):
            return life
        self.learner.hit(life.cls, self.tick - life.tick)
        life.tick, life.touched_at, life.reads = self.tick, self._clock(), life.reads + 1
        self.tick += 1
        self._last_read = (key, self.tick)
        for listener in self.reread:
            listener(key)
        return life

    def named(self, keys: Sequence[bytes]) -> None:
        """A lookup named `keys`, stored or not."""
        for key in keys:
            self._named[key] = self._named.pop(key, 0) + 1
            if len(self._named) > self._named_max:
                self._named.popitem(last=False)  # the least recently named

    def missed(self, keys: Sequence[bytes]) -> None:
        """A lookup named `keys` beyond its stored prefix."""
        for key in keys:
            if key not in self.lives:
                self._needed_again(key, "lookup")

    def _needed_again(self, key: bytes, heard: str) -> None:
        """An evicted key was needed again: its unread end becomes a read at that age."""
        ghost = self._ghosts.pop(key, None)
        if ghost is not None:
            metrics.EVICTED_NEEDED_AGAIN.labels(heard).inc()
            cls, tick, epoch = ghost
            self.learner.evicted(cls, undo_from=epoch)
            self.learner.hit(cls, self.tick - tick)

    def dropped(self, key: bytes) -> None:
        """A tier dropped its copy; with the last one the life ends unread."""
        life = self.lives.get(key)
        if life is None:
            return
        life.copies -= 1
        if life.copies > 0:
            return
        del self.lives[key]
        self.learner.evicted(life.cls)  # taken back if it is needed again while a ghost
        self._ghosts[key] = (life.cls, life.tick, self.learner.epoch)
        if len(self._ghosts) > self._ghosts_max:
            self._ghosts.popitem(last=False)  # the earliest evicted
        self._unlink(key)

    def chain(self, keys: Sequence[bytes]) -> None:
        """`keys` are a chain, root first."""
        for parent, child in itertools.pairwise(keys):
            self.link(parent, child)

    def link(self, parent: bytes, child: bytes) -> None:
        if child in self.lives and self._parent.get(child) != parent:
            self._unlink(child)
            self._parent[child] = parent
            self.children.setdefault(parent, set()).add(child)

    def parent(self, key: bytes) -> bytes | None:
        return self._parent.get(key)

    def _unlink(self, child: bytes) -> None:
        parent = self._parent.pop(child, None)
        if parent is not None:
            siblings = self.children[parent]
            siblings.discard(child)
            if not siblings:
                del self.children[parent]
            for listener in self.lost_child:
                listener(parent)
