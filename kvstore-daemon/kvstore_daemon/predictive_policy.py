"""The predictive eviction order: learned hit density, steered by the scheduler's hints.

Online, no policy knows which chunks come back, but the store can learn how often chunks
like a given one did, and after how long (hit_density.py, after LHD): per class of
chunk — how often lookups named it before this life plus its reads in this life (0, 1,
2, 3 or more) — the expected hits per tick at its idle age (chunk_lives.py keeps the
lives both tiers share). The scheduler's word comes first where it is certain, and
orders chunks the learner cannot tell apart where it is an estimate:

1. keys hinted EVICT_FIRST or DECLINE (least recently used first): ended, deleted or
   expired sessions, chunks released;
2. every other key by hit density, lowest first; among equals unhinted keys the latest
   predictions passed over, then predicted ones (furthest use first), then keys written or
   read since (least recently first), then the longer idle, then the deeper in its hinted
   chain, the later touched;
3. but a key goes only after its children (a chain loses its tail first, so what stays
   is a prefix that can hit): in DRAM its children in DRAM, on SSD (which decides what
   leaves the store) its children anywhere in the store;
4. queued jobs' keys by queue position, furthest first (`Hint.rank`).

The ranking is sorted when a source replaces its predictions (every few seconds) and
whenever the keys touched since outnumber an eighth of the resident ones, not per victim:
keys touched in between, and keys whose prediction a source added or changed since (the
changed sessions the scheduler sends with every push), wait in a small list sorted by
their rank then, merged into the walk; each key's latest entry is the valid one. Each
key's live hint is checked as the walk reaches it, so a key a queued job now needs moves
to the end.
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from graphlib import TopologicalSorter

from kvstore_daemon.chunk_lives import ChunkLives, Life
from kvstore_daemon.hints import Hint, HintAction, HintBook
from kvstore_daemon.hit_density import age_bin

RERANK_SHARE = 8  # re-sort once the keys touched since the last sort reach 1/8 of the resident ones

# (density, *_tie_break, -age bin, -depth, -tick): lowest first
_Rank = tuple[float, int, float, int, int, int]


class PredictivePolicy:
    def __init__(
        self,
        hints: HintBook,
        clock: Callable[[], float] = time.monotonic,
        lives: ChunkLives | None = None,
        lowest_tier: bool = True,
    ) -> None:
        """`lives` is shared with the other tier's instance (a fresh one: this tier alone);
        `lowest_tier`: evicting from it drops a chunk from the store."""
        self._hints = hints
        self._clock = clock
        self.lives = lives or ChunkLives(clock)
        self._lowest = lowest_tier
        self._resident: set[bytes] = set()
        self._sorted_for = -1  # the prediction generation at the last sort
        self._repredicted_seen = 0  # of the hint book's repredicted keys, those ranked again
        self._entry: dict[bytes, _Rank] = {}  # each resident ranked key's latest rank: its valid entry
        # EVICT_FIRST/DECLINE at the sort -> tick; LRU first
        self._given_up: OrderedDict[bytes, int] = OrderedDict()
        self._ranked: list[tuple[_Rank, bytes]] = []  # the rest at the sort, lowest density first
        self._start = 0  # _ranked[:_start] is no longer valid
        self._fresh: list[tuple[_Rank, bytes]] = []  # touched since the sort, by density at the touch
        # Keys the walk found with children, set aside until a child goes (or the next sort),
        # so a walk does not step over every chain's inner keys again.
        self._parked: set[bytes] = set()
        # Keys whose eviction has begun (DRAM: the SSD copy being written), out of the walk
        # until they leave or stay: each walk stepped over every one of them before, at
        # DRAM 5% of Mooncake's working set 23-51 per victim (in process).
        self._leaving: set[bytes] = set()
        self.lives.lost_child.append(self._maybe_unpark)

    def on_insert(self, key: bytes) -> None:
        if key not in self._resident:
            self._resident.add(key)
            self._ranked_again(key, self.lives.copied(key))

    def on_access(self, key: bytes) -> None:
        if key in self._resident and (life := self.lives.read(key)) is not None:
            self._ranked_again(key, life)

    def on_remove(self, key: bytes) -> None:
        if key in self._resident:
            self._resident.discard(key)
            self._leaving.discard(key)
            self._parked.discard(key)
            self._given_up.pop(key, None)
            self._entry.pop(key, None)
            parent = self.lives.parent(key)
            self.lives.dropped(key)
            if parent is not None and not self._lowest:  # in DRAM only DRAM children count
                self._maybe_unpark(parent)

    def set_aside(self, key: bytes) -> None:
        """The key's eviction began: walks skip it, and in DRAM its parent may go next."""
        if key in self._resident and key not in self._leaving:
            self._leaving.add(key)
            self._entry.pop(key, None)
            self._given_up.pop(key, None)
            self._parked.discard(key)
            parent = self.lives.parent(key)
            if parent is not None and not self._lowest:
                self._maybe_unpark(parent)

    def kept(self, key: bytes) -> None:
        """After an eviction `set_aside` announced: if the key is still resident (read
        meanwhile, or the eviction cancelled), it is a candidate again."""
        if key in self._leaving:
            self._leaving.discard(key)
            self._ranked_again(key, self.lives.lives[key])

    def on_chain(self, keys: Sequence[bytes]) -> None:
        """`keys` are a chain, root first (a lookup's stored prefix)."""
        self.lives.chain(keys)
        self.lives.named(keys)

    def on_miss(self, keys: Sequence[bytes]) -> None:
        """A lookup named `keys` beyond its stored prefix (what it learns: chunk_lives.missed)."""
        self.lives.missed(keys)
        self.lives.named(keys)

    def __len__(self) -> int:
        return len(self._resident)

    def __contains__(self, key: object) -> bool:
        return key in self._resident

    def victims(self) -> Iterator[bytes]:
        return self._walk(self.refresh())

    def refresh(self) -> float:
        """Takes in the hints and touches since the last walk; returns the time it did."""
        now = self._clock()
        self._hints.expire(now)
        if self._hints.prediction_generation != self._sorted_for or len(self._fresh) * RERANK_SHARE > max(
            len(self._resident), RERANK_SHARE
        ):
            self._sort(now)
        else:
            self._rank_repredicted(now)
        return now

    # ---- ranking ---------------------------------------------------------------

    def _rank(self, life: Life, hint: Hint | None) -> _Rank:
        age = self.lives.tick - life.tick
        # Equal densities across age bins are zeros (nothing learned for the class, or no read
        # seen that late): there the scheduler's word is the only information, so it goes first.
        return (
            self.lives.learner.density(life.cls, age),
            *_tie_break(hint, life, self._hints.last_prediction_at),
            -age_bin(age),
            -life.depth,
            -life.tick,
        )

    def _ranked_again(self, key: bytes, life: Life) -> None:
        """The key was written or read: it waits among the fresh keys until the next sort."""
        self._given_up.pop(key, None)
        hint = self._hints.get(key, self._clock())
        if hint is not None and hint.parent is not None:
            self.lives.link(hint.parent, key)
        self._add_fresh(key, self._rank(life, hint))

    def _add_fresh(self, key: bytes, rank: _Rank) -> None:
        self._entry[key] = rank
        bisect.insort(self._fresh, (rank, key))

    def _heard(self, key: bytes, now: float) -> tuple[Life, Hint | None]:
        """Takes in what the scheduler last said of a key (its chain place)."""
        life = self.lives.lives[key]
        hint = self._hints.get(key, now)
        if hint is not None and hint.parent is not None:
            self.lives.link(hint.parent, key)
        if hint is not None and hint.action is HintAction.PREDICT:
            life.depth = hint.depth
        return life, hint

    def _sort(self, now: float) -> None:
        self._given_up.clear()
        self._entry = {}
        ranked = []
        for key in self._resident - self._leaving:
            life, hint = self._heard(key, now)
            if hint is not None and hint.action.gives_up:
                self._given_up[key] = life.tick
            else:  # queued keys too: their live hint sets them aside in the walk
                rank = self._entry[key] = self._rank(life, hint)
                ranked.append((rank, key))
        ranked.sort()
        self._ranked, self._start, self._fresh, self._parked = ranked, 0, [], set()
        self._given_up = OrderedDict(sorted(self._given_up.items(), key=lambda item: item[1]))
        self._sorted_for = self._hints.prediction_generation
        self._repredicted_seen = len(self._hints.repredicted)

    def _rank_repredicted(self, now: float) -> None:
        """Ranks again the keys whose prediction a source added since (no full sort)."""
        repredicted = self._hints.repredicted
        for key in dict.fromkeys(repredicted[self._repredicted_seen :]):
            if key not in self._resident or key in self._leaving:
                continue
            life, hint = self._heard(key, now)
            if hint is not None and hint.action.gives_up:
                self._entry.pop(key, None)
                self._given_up[key] = life.tick
            else:
                self._given_up.pop(key, None)
                self._parked.discard(key)
                self._add_fresh(key, self._rank(life, hint))
        self._repredicted_seen = len(repredicted)

    def given_up(self, now: float) -> Iterator[bytes]:
        """Resident keys hinted EVICT_FIRST or DECLINE (at the last sort and still), least
        recently used first."""
        for key in list(self._given_up):
            hint = self._hints.get(key, now)
            if hint is not None and hint.action.gives_up:
                yield key

    def _walk(self, now: float) -> Iterator[bytes]:
        queued: list[tuple[tuple[bool, float, int, bool], bytes]] = []
        yield from self.given_up(now)
        ranked = self._ranked
        while self._start < len(ranked) and (
            not self._valid(ranked[self._start]) or self._park(ranked[self._start][1])
        ):
            self._start += 1  # evicted, touched since the sort, or parked: skipped for good
        for entry in heapq.merge((ranked[i] for i in range(self._start, len(ranked))), self._fresh):
            key = entry[1]
            if not self._valid(entry) or key in self._parked:
                continue
            hint = self._hints.get(key, now)
            if hint is not None and hint.action in (HintAction.PREFETCH, HintAction.PROTECT):
                queued.append((hint.rank(), key))
            elif self._park(key):
                continue
            elif key not in self._given_up:
                yield key
        # Reached only when no leaf may go (pinned, leased, queued): children before parents.
        parked = TopologicalSorter(
            {key: self.lives.children.get(key, set()) & self._parked for key in self._parked}
        )
        for key in list(parked.static_order()):
            hint = self._hints.get(key, now)
            if hint is None or hint.action not in (HintAction.PREFETCH, HintAction.PROTECT):
                yield key
        queued.sort(key=lambda item: item[0], reverse=True)
        yield from (key for _, key in queued)

    def _has_children(self, key: bytes) -> bool:
        children = self.lives.children.get(key)
        if not children:
            return False
        return self._lowest or any(
            child in self._resident and child not in self._leaving for child in children
        )

    def _park(self, key: bytes) -> bool:
        """Sets a key with children aside (True) until a child goes."""
        if key in self._parked:
            return True
        if not self._has_children(key):
            return False
        self._parked.add(key)
        return True

    def _maybe_unpark(self, key: bytes) -> None:
        """A child of `key` went: without children left it is a candidate again."""
        if key in self._parked and not self._has_children(key):
            self._parked.discard(key)
            life = self.lives.lives[key]
            self._add_fresh(key, self._rank(life, self._hints.get(key, self._clock())))

    def _valid(self, entry: tuple[_Rank, bytes]) -> bool:
        """The entry is the key's latest: resident, not touched or ranked again since."""
        return self._entry.get(entry[1]) is entry[0]


def _tie_break(hint: Hint | None, life: Life, predictions_at: float) -> tuple[int, float]:
    """Among equal densities: unhinted keys the latest predictions passed over first (no
    live session the scheduler knows needs them), then predicted ones, the furthest use
    first, then keys touched since the predictions arrived (the scheduler has not seen
    them yet), least recently touched first."""
    if hint is not None and hint.action is HintAction.PREDICT:
        return 1, -hint.next_use_at
    return (0, life.touched_at) if life.touched_at < predictions_at else (2, life.touched_at)
