"""The scheduler's hints: which chunks its queue will need and how soon, and when it
predicts every other live chunk to be read next.

As in AttentionStore, the scheduler sees the job queue and tells the daemon, per
namespace, which keys to prefetch or protect (with the queue position of the job that
needs them) and which it may evict first. A predictive scheduler also sends, for chunks
no queued job needs, the seconds until it expects them to be read (PREDICT), and names
the chunks it expects never to be read again (DECLINE: not stored, evicted first).
Hints expire after a TTL, so a scheduler that goes quiet stops steering eviction
instead of pinning stale choices forever.

Hints come from sources (scheduler replicas): `replace` forgets only its own source's
hints of the namespace, and a key hinted by several sources follows the most urgent live
one, so one replica's push never unprotects another replica's sessions.

All `now` arguments are seconds on one monotonic clock chosen by the caller.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple


class HintAction(enum.Enum):
    PREFETCH = "prefetch"  # needed soon: load into DRAM ahead of time and keep it
    PROTECT = "protect"  # needed soon: keep it where it is
    PREDICT = "predict"  # not queued: expected to be read at `next_use_at`
    EVICT_FIRST = "evict_first"  # not needed by anything queued: evict before the rest
    DECLINE = "decline"  # never read again, as far as the scheduler knows: do not store it

    @property
    def gives_up(self) -> bool:
        """The key may go before every unhinted one."""
        return self in (HintAction.EVICT_FIRST, HintAction.DECLINE)


class HintSpec(NamedTuple):
    """One entry as the servicer (and a client) passes it: a chain of keys, root first."""

    keys: Sequence[bytes]
    action: HintAction
    queue_position: int
    next_use_seconds: float = 0.0  # from now; 0 for queued jobs (their position orders them)


class Hint(NamedTuple):  # a tuple: a push builds one per key, tens of thousands at a time
    action: HintAction
    queue_position: int  # 0 = the next job the scheduler will run
    expires_at: float  # seconds on the caller's clock; absent from this moment on
    next_use_at: float = 0.0  # PREDICT: when the key is expected to be read (same clock)
    depth: int = 0  # the key's place in its hinted chain (0 = root)
    parent: bytes | None = None  # the key before it in that chain

    def urgency(self) -> tuple[bool, bool, float, int, bool]:
        """Lower is more urgent: any keeping hint beats EVICT_FIRST/DECLINE, a queued job's
        beats a prediction, then the sooner predicted use, then the lower queue position,
        then PREFETCH beats the rest (it also asks for a load)."""
        return (
            self.action.gives_up,
            self.action is HintAction.PREDICT,
            self.next_use_at,
            self.queue_position,
            self.action is not HintAction.PREFETCH,
        )

    def rank(self) -> tuple[bool, float, int, bool]:
        """The predictive order of kept keys, the larger evicted first: predictions before
        queued jobs; then the later predicted use (or the further queue position); then the
        deeper key; then PROTECT before PREFETCH."""
        predicted = self.action is HintAction.PREDICT
        return (
            predicted,
            self.next_use_at if predicted else self.queue_position,
            self.depth,
            self.action is not HintAction.PREFETCH,
        )


Group = tuple[bytes, str]  # (namespace, source)
REPREDICTED_SHARE = 8  # additions of more than 1/8 of the hinted keys count as new predictions


class HintBook:
    """Live hints by key and source; each key's effective hint is its most urgent one."""

    def __init__(self) -> None:
        self._groups: dict[Group, dict[bytes, Hint]] = {}  # each source's hints per namespace
        self._holders: dict[bytes, set[Group]] = {}  # key -> the groups that hint it
        self._hints: dict[bytes, Hint] = {}  # key -> its most urgent hint (may have expired)
        self._evict_first: set[bytes] = set()  # keys whose effective hint gives up
        self._next_expiry = math.inf  # no stored hint expires earlier (a lower bound)
        self.generation = 0  # changes whenever stored hints change, so readers can cache
        # When a source last replaced its predictions (PREDICT/DECLINE): keys touched since
        # are news to them.
        self.last_prediction_at = -math.inf
        self.prediction_generation = 0  # changes whenever a source replaces its predictions
        # Keys predicted since by additions (a scheduler's changed sessions, every push): the
        # policy re-ranks these alone rather than every resident key (a full re-sort per push
        # cost the Mooncake 10-minute replay 190 s of its 200 s in a model of the daemon).
        self.repredicted: list[bytes] = []

    def __len__(self) -> int:
        """Hinted keys, including expired ones that `expire` has not dropped yet."""
        return len(self._hints)

    def apply(
        self,
        namespace: bytes,
        entries: Iterable[tuple[Sequence[bytes], HintAction, int] | HintSpec],
        replace: bool,
        ttl_seconds: float,
        now: float,
        source: str = "",
    ) -> int:
        """Records (keys, action, queue_position[, next_use_seconds]) entries from `source`;
        returns the live hints that source holds in the namespace.

        `replace` first forgets the source's earlier hints of the namespace (it sends its
        whole window). A key named twice by one source keeps its most urgent hint; an
        equally urgent one refreshes the expiry.
        """
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
        group = (namespace, source)
        # A replace builds the source's new set beside the old one and settles only what
        # changed: a predictive scheduler sends every live chain (tens of thousands of keys).
        earlier = self._groups.pop(group, {}) if replace else {}
        mine = {} if replace else self._groups.setdefault(group, {})
        self._groups[group] = mine
        changed: list[bytes] = []
        expires_at = now + ttl_seconds
        self._next_expiry = min(self._next_expiry, expires_at)
        self.generation += 1
        for entry in entries:
            spec = HintSpec(*entry)
            if spec.queue_position < 0:
                raise ValueError(f"queue_position must not be negative, got {spec.queue_position}")
            if not 0 <= spec.next_use_seconds < math.inf:
                raise ValueError(
                    f"next_use_seconds must be finite and not negative, got {spec.next_use_seconds}"
                )
            predicts = spec.action in (HintAction.PREDICT, HintAction.DECLINE)
            if predicts and replace and self.last_prediction_at != now:
                self._new_predictions(now)
            next_use_at = now + spec.next_use_seconds if spec.action is HintAction.PREDICT else 0.0
            parent = None
            for depth, key in enumerate(spec.keys):
                candidate = Hint(spec.action, spec.queue_position, expires_at, next_use_at, depth, parent)
                parent = key
                current = mine.get(key)
                if current is None or current.expires_at <= now or candidate.urgency() <= current.urgency():
                    mine[key] = candidate
                    changed.append(key)
                    if predicts and not replace:
                        self.repredicted.append(key)
        if len(self.repredicted) > len(self._hints) // REPREDICTED_SHARE + REPREDICTED_SHARE:
            self._new_predictions(now)  # re-ranking them one by one would cost more than a sort
        for key in changed:
            self._holders.setdefault(key, set()).add(group)
            self._settle(key, now)
        for key in earlier.keys() - mine.keys():
            self._unhold(group, key)
        if not mine:
            del self._groups[group]
        return sum(1 for hint in mine.values() if hint.expires_at > now)

    def _new_predictions(self, now: float) -> None:
        self.last_prediction_at = now
        self.prediction_generation += 1
        self.repredicted = []

    def get(self, key: bytes, now: float) -> Hint | None:
        hint = self._hints.get(key)
        return hint if hint is not None and hint.expires_at > now else None

    def declines(self, key: bytes, now: float) -> bool:
        """Whether the key's effective hint says not to store it."""
        hint = self.get(key, now)
        return hint is not None and hint.action is HintAction.DECLINE

    def items(self) -> Iterable[tuple[bytes, Hint]]:
        """Every key's effective hint, expired ones included (check `expires_at`)."""
        return self._hints.items()

    def prefetch_keys(self, now: float) -> list[bytes]:
        """Keys with a live PREFETCH hint, soonest-needed first."""
        live = [
            (hint.queue_position, key)
            for key, hint in self._hints.items()
            if hint.action is HintAction.PREFETCH and hint.expires_at > now
        ]
        live.sort(key=lambda item: item[0])  # stable: equal positions keep hint order
        return [key for _, key in live]

    def evict_first_keys(self, now: float) -> list[bytes]:
        """Keys with a live EVICT_FIRST or DECLINE hint, in no particular order."""
        return [key for key in self._evict_first if self._hints[key].expires_at > now]

    def expire(self, now: float) -> int:
        """Drops expired hints; returns how many keys lost one. Cheap until the earliest
        hint expires."""
        if now < self._next_expiry:
            return 0
        expired = [
            (group, key)
            for group, hints in self._groups.items()
            for key, hint in hints.items()
            if hint.expires_at <= now
        ]
        for group, key in expired:
            self._drop(group, key)
        for key in {key for _, key in expired}:
            self._settle(key, now)
        self._next_expiry = min(
            (hint.expires_at for hints in self._groups.values() for hint in hints.values()), default=math.inf
        )
        return len(expired)

    def forget(self, keys: Iterable[bytes]) -> None:
        """Drops every source's hints of `keys` (deleted chunks); unknown keys are ignored."""
        for key in keys:
            for group in list(self._holders.get(key, ())):
                self._drop(group, key)
            self._settle(key, -math.inf)

    def _drop(self, group: Group, key: bytes) -> None:
        hints = self._groups[group]
        del hints[key]
        if not hints:
            del self._groups[group]  # the group count stays bounded by live ones
        self._unhold(group, key)

    def _unhold(self, group: Group, key: bytes) -> None:
        """The group no longer hints the key (its own dict is already updated)."""
        holders = self._holders[key]
        holders.discard(group)
        if not holders:
            del self._holders[key]
        self._settle(key, -math.inf)

    def _settle(self, key: bytes, now: float) -> None:
        """Recomputes the key's effective hint from its sources' live ones."""
        holders = self._holders.get(key, ())
        if len(holders) == 1:  # the common case: one source hints it
            (group,) = holders
            best: Hint | None = self._groups[group][key]
        else:
            candidates = [self._groups[group][key] for group in holders]
            live = [hint for hint in candidates if hint.expires_at > now]
            best = min(live or candidates, key=Hint.urgency, default=None)
        if best is self._hints.get(key):
            return
        self.generation += 1
        if best is None:
            del self._hints[key]
            self._evict_first.discard(key)
            return
        self._hints[key] = best
        if best.action.gives_up:
            self._evict_first.add(key)
        else:
            self._evict_first.discard(key)
