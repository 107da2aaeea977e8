"""The predictive eviction order: learned hit density, steered by the scheduler's hints.

Online, no policy knows which chunks come back, but a tier can learn how often chunks
like a given one did, and after how long (hit_density.py, LHD): per class of chunk —
how often it was read before (0, 1, 2, 3 or more times) and what the scheduler last
said of it while it sat idle (nothing yet; nothing although it predicted others since:
no live session it knows needs it; or its predicted next use, in four buckets) — the
expected hits per tick of room at its idle age. The scheduler's word comes first where
it is certain, and counts as far as it has proven right where it is an estimate:

1. keys hinted EVICT_FIRST or DECLINE (least recently used first): ended, deleted or
   expired sessions, chunks released;
2. every other key by hit density, lowest first; among equals the longer idle, then the
   later predicted use, then the deeper in its hinted chain (a chain's tail before its
   root, so what stays is a prefix that can hit), then the later touched;
3. queued jobs' keys by queue position, furthest first (`Hint.rank`).

The ranking is sorted when predictions arrive (every few seconds) and whenever the keys
touched since outnumber an eighth of the resident ones, not per victim: keys touched
in between wait in a small list sorted by their density at touch, merged into the walk.
Each key's live hint is checked as the walk reaches it, so a key a queued job now needs
moves to the end. Each tier has its own instance and learner: DRAM learns which chunks
are read again while in DRAM, SSD which are read again at all.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from kvstore_daemon.hints import Hint, HintAction, HintBook
from kvstore_daemon.hit_density import HitDensity, age_bin

# An evicted key is remembered (as a ghost) this many resident counts of ticks: stored
# again within that, it was needed again, and counts as a hit at that age; else as a
# lifetime that ended unread at that age. Learning only from what stayed resident would
# never see a reuse later than the tier keeps chunks now (LHD's exploration problem).
GHOST_HORIZON = 4
RERANK_SHARE = 8  # re-sort once the keys touched since the last sort reach 1/8 of the resident ones
REUSE_CLASSES = 4  # read 0, 1, 2, 3 or more times
# What the scheduler said of an idle key: 0 nothing yet, 1 nothing although it predicted
# others since (stale), then PREDICT buckets by seconds to the predicted use.
PREDICT_BUCKETS_SECONDS = (30.0, 120.0, 600.0)
HINT_CLASSES = 2 + len(PREDICT_BUCKETS_SECONDS) + 1

_Rank = tuple[float, int, int, float, int, int]  # (density, -age bin, *_tie_break, -depth, -tick): lowest first


@dataclass
class _Key:
    tick: int  # the tier's event count at its last insert or read
    touched_at: float  # the clock at its last insert or read
    reads: int = 0  # reads since it was inserted
    hint_class: int = 0  # what the scheduler said of it when last ranked (hint_classes.py)
    depth: int = 0  # its place in its hinted chain, when one was hinted


class PredictivePolicy:
    def __init__(self, hints: HintBook, clock: Callable[[], float] = time.monotonic,
                 learner: HitDensity | None = None) -> None:
        self._hints = hints
        self._clock = clock
        self.learner = learner or HitDensity(REUSE_CLASSES * HINT_CLASSES)
        self._tick = 0
        self._keys: dict[bytes, _Key] = {}
        self._sorted_for = -1  # the prediction generation at the last sort
        self._given_up: OrderedDict[bytes, int] = OrderedDict()  # EVICT_FIRST/DECLINE at the sort -> tick; LRU first
        self._ranked: list[tuple[_Rank, bytes]] = []  # the rest at the sort, lowest density first
        self._start = 0  # _ranked[:_start] is no longer valid
        self._fresh: list[tuple[_Rank, bytes]] = []  # touched since the sort, by density at the touch
        self._ghosts: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # evicted key -> (class, last touch tick)
        self._parent: dict[bytes, bytes] = {}  # resident key -> its parent in a chain seen read or hinted
        self._children: dict[bytes, set[bytes]] = {}  # key -> its resident children

    def on_chain(self, keys: Sequence[bytes]) -> None:
        """`keys` are a chain, root first (a lookup's stored prefix, a hinted chain): a key
        whose resident children are known is evicted only after them."""
        for parent, child in zip(keys, keys[1:]):
            self._link(parent, child)

    def _link(self, parent: bytes, child: bytes) -> None:
        if child in self._keys and self._parent.get(child) != parent:
            self._unlink(child)
            self._parent[child] = parent
            self._children.setdefault(parent, set()).add(child)

    def _unlink(self, child: bytes) -> None:
        parent = self._parent.pop(child, None)
        if parent is not None:
            siblings = self._children[parent]
            siblings.discard(child)
            if not siblings:
                del self._children[parent]

    def on_insert(self, key: bytes) -> None:
        ghost = self._ghosts.pop(key, None)
        if ghost is not None:  # evicted, and needed again
            cls, tick = ghost
            self.learner.evicted(cls, undo=True)
            self.learner.hit(cls, self._tick - tick)
        self._keys[key] = _Key(self._tick, self._clock())
        self._touched(key)

    def on_access(self, key: bytes) -> None:
        state = self._keys.get(key)
        if state is None:
            return
        self.learner.hit(self._class(state), self._tick - state.tick)
        state.tick, state.touched_at, state.reads, state.hint_class = self._tick, self._clock(), state.reads + 1, 0
        self._touched(key)

    def on_remove(self, key: bytes) -> None:
        state = self._keys.pop(key, None)
        if state is not None:
            cls = self._class(state)
            self.learner.evicted(cls)  # taken back if it is stored again within the ghost horizon
            self._ghosts[key] = (cls, state.tick)
            self._given_up.pop(key, None)
            self._unlink(key)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def victims(self) -> Iterator[bytes]:
        now = self._clock()
        self._hints.expire(now)
        if (self._hints.prediction_generation != self._sorted_for
                or len(self._fresh) * RERANK_SHARE > max(len(self._keys), RERANK_SHARE)):
            self._sort(now)
        return self._walk(now)

    # ---- ranking ---------------------------------------------------------------

    def _class(self, state: _Key) -> int:
        return min(state.reads, REUSE_CLASSES - 1) * HINT_CLASSES + state.hint_class

    def _rank(self, state: _Key, tie_break: tuple[int, float]) -> _Rank:
        age = self._tick - state.tick
        return (self.learner.density(self._class(state), age), -age_bin(age), *tie_break, -state.depth, -state.tick)

    def _touched(self, key: bytes) -> None:
        state = self._keys[key]
        self._tick += 1
        horizon = GHOST_HORIZON * len(self._keys)
        while self._ghosts:  # roughly oldest first: evicted in the order the policy chose
            _, tick = next(iter(self._ghosts.values()))
            if self._tick - tick <= horizon and len(self._ghosts) <= horizon:
                break
            self._ghosts.popitem(last=False)
        self._given_up.pop(key, None)
        hint = self._hints.get(key, self._clock())
        if hint is not None and hint.parent is not None:
            self._link(hint.parent, key)
        bisect.insort(self._fresh, (self._rank(state, _tie_break(hint, state, self._hints.last_prediction_at)), key))

    def _sort(self, now: float) -> None:
        since = self._hints.last_prediction_at
        self._given_up.clear()
        ranked = []
        for key, state in self._keys.items():
            hint = self._hints.get(key, now)
            if hint is not None and hint.parent is not None:
                self._link(hint.parent, key)
            if hint is None or hint.action is HintAction.PREDICT:
                state.hint_class = hint_class(hint, now, stale=state.touched_at < since)
                if hint is not None:
                    state.depth = hint.depth
            if hint is not None and hint.action.gives_up:
                self._given_up[key] = state.tick
            else:  # queued keys too: their live hint sets them aside in the walk
                ranked.append((self._rank(state, _tie_break(hint, state, since)), key))
        ranked.sort()
        self._ranked, self._start, self._fresh = ranked, 0, []
        self._given_up = OrderedDict(sorted(self._given_up.items(), key=lambda item: item[1]))
        self._sorted_for = self._hints.prediction_generation

    def _walk(self, now: float) -> Iterator[bytes]:
        queued: list[tuple[tuple[bool, float, int, bool], bytes]] = []
        inner: list[bytes] = []  # keys with resident children: after every leaf (pinned children stay)
        for key in list(self._given_up):
            hint = self._hints.get(key, now)
            if hint is not None and hint.action.gives_up:
                yield key
        while self._start < len(self._ranked) and not self._valid(self._ranked[self._start]):
            self._start += 1  # evicted or touched since the sort: skipped for good
        ranked = (self._ranked[i] for i in range(self._start, len(self._ranked)))
        for entry in heapq.merge(ranked, self._fresh):
            if not self._valid(entry):
                continue
            key = entry[1]
            hint = self._hints.get(key, now)
            if hint is not None and hint.action in (HintAction.PREFETCH, HintAction.PROTECT):
                queued.append((hint.rank(), key))
            elif key in self._children:
                inner.append(key)
            elif key not in self._given_up:
                yield key
        yield from inner
        queued.sort(key=lambda item: item[0], reverse=True)
        yield from (key for _, key in queued)

    def _valid(self, entry: tuple[_Rank, bytes]) -> bool:
        """The entry is the key's latest: resident and not touched since it was made."""
        state = self._keys.get(entry[1])
        return state is not None and -entry[0][5] == state.tick


def hint_class(hint: Hint | None, now: float, stale: bool) -> int:
    """The class of an unhinted or PREDICT-hinted key (see HINT_CLASSES); `stale`: it was
    last touched before the latest predictions arrived."""
    if hint is None:
        return 1 if stale else 0
    return 2 + bisect.bisect_right(PREDICT_BUCKETS_SECONDS, hint.next_use_at - now)



def _tie_break(hint: Hint | None, state: _Key, predictions_at: float) -> tuple[int, float]:
    """Among equal densities: unhinted keys the latest predictions passed over first (no
    live session the scheduler knows needs them), then predicted ones, the furthest use
    first, then keys touched since the predictions arrived (the scheduler has not seen
    them yet), least recently touched first."""
    if hint is not None and hint.action is HintAction.PREDICT:
        return 1, -hint.next_use_at
    return (0, state.touched_at) if state.touched_at < predictions_at else (2, state.touched_at)
