"""The scheduler's look-ahead hints: which chunks its queue will need, and how soon.

As in AttentionStore, the scheduler sees the job queue and tells the daemon, per
namespace, which keys to prefetch or protect (with the queue position of the job that
needs them) and which it may evict first. Hints expire after a TTL, so a scheduler that
goes quiet stops steering eviction instead of pinning stale choices forever.

All `now` arguments are seconds on one monotonic clock chosen by the caller.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class HintAction(enum.Enum):
    PREFETCH = "prefetch"  # needed soon: load into DRAM ahead of time and keep it
    PROTECT = "protect"  # needed soon: keep it where it is
    EVICT_FIRST = "evict_first"  # not needed by anything queued: evict before the rest


@dataclass(frozen=True)
class Hint:
    action: HintAction
    queue_position: int  # 0 = the next job the scheduler will run
    expires_at: float  # seconds on the caller's clock; absent from this moment on

    def urgency(self) -> tuple[bool, int, bool]:
        """Lower is more urgent: any PREFETCH/PROTECT beats EVICT_FIRST, then the lower
        queue position wins, then PREFETCH beats PROTECT (it also asks for a load)."""
        return (
            self.action is HintAction.EVICT_FIRST,
            self.queue_position,
            self.action is not HintAction.PREFETCH,
        )


class HintBook:
    """Live hints by key, plus each namespace's keys so a namespace can replace its set."""

    def __init__(self) -> None:
        self._hints: dict[bytes, Hint] = {}
        self._namespace_of: dict[bytes, bytes] = {}
        self._keys_of: dict[bytes, set[bytes]] = {}
        self._evict_first: set[bytes] = set()  # keys whose stored hint is EVICT_FIRST
        self._next_expiry = math.inf  # no stored hint expires earlier (a lower bound)
        self.generation = 0  # changes whenever stored hints change, so readers can cache

    def __len__(self) -> int:
        """Stored hints, including expired ones that `expire` has not dropped yet."""
        return len(self._hints)

    def apply(
        self,
        namespace: bytes,
        entries: Iterable[tuple[Sequence[bytes], HintAction, int]],
        replace: bool,
        ttl_seconds: float,
        now: float,
    ) -> int:
        """Records (keys, action, queue_position) entries; returns the namespace's live hint count.

        `replace` first forgets every earlier hint of the namespace (the scheduler sends
        its whole window). A key hinted more than once keeps its most urgent live hint
        (see `Hint.urgency`); an equally urgent hint refreshes the expiry.
        """
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
        if replace:
            self.forget(list(self._keys_of.get(namespace, ())))
        expires_at = now + ttl_seconds
        self._next_expiry = min(self._next_expiry, expires_at)
        self.generation += 1
        for keys, action, queue_position in entries:
            if queue_position < 0:
                raise ValueError(f"queue_position must not be negative, got {queue_position}")
            candidate = Hint(action, queue_position, expires_at)
            for key in keys:
                current = self.get(key, now)
                if current is None or candidate.urgency() <= current.urgency():
                    self._set(namespace, key, candidate)
        keys_now = self._keys_of.get(namespace, set())
        return sum(1 for key in keys_now if self._hints[key].expires_at > now)

    def get(self, key: bytes, now: float) -> Hint | None:
        hint = self._hints.get(key)
        return hint if hint is not None and hint.expires_at > now else None

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
        """Keys with a live EVICT_FIRST hint, in no particular order."""
        return [key for key in self._evict_first if self._hints[key].expires_at > now]

    def expire(self, now: float) -> int:
        """Drops expired hints; returns how many. Cheap until the earliest hint expires."""
        if now < self._next_expiry:
            return 0
        expired = [key for key, hint in self._hints.items() if hint.expires_at <= now]
        self.forget(expired)
        self._next_expiry = min((hint.expires_at for hint in self._hints.values()), default=math.inf)
        return len(expired)

    def forget(self, keys: Iterable[bytes]) -> None:
        """Drops the hints of `keys` (deleted chunks); unknown keys are ignored."""
        for key in keys:
            if self._hints.pop(key, None) is not None:
                self._evict_first.discard(key)
                self._unlink_namespace(key)
                self.generation += 1

    def _set(self, namespace: bytes, key: bytes, hint: Hint) -> None:
        if self._namespace_of.get(key, namespace) != namespace:
            self._unlink_namespace(key)  # keys are namespace-unique; stay consistent anyway
        if hint.action is HintAction.EVICT_FIRST:
            self._evict_first.add(key)
        else:
            self._evict_first.discard(key)
        self._hints[key] = hint
        self._namespace_of[key] = namespace
        self._keys_of.setdefault(namespace, set()).add(key)

    def _unlink_namespace(self, key: bytes) -> None:
        namespace = self._namespace_of.pop(key)
        keys = self._keys_of[namespace]
        keys.discard(key)
        if not keys:
            del self._keys_of[namespace]  # the namespace count stays bounded by live ones
