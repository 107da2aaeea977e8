"""What one scheduler replica has seen of its sessions, and the predictions it pushes.

The turn path reports each turn's start and end, deletions and the application's
expectations; `predictions(now)` turns that into hint entries per node and namespace:
PREDICT (seconds to the predicted next use, next_use.py) for the chain of every live
session, DECLINE for the chains of sessions that are over (deleted, past their TTL, or
said over by the application) for `decline_seconds` after, so their KV is dropped first
and not stored again. A chunk shared by several sessions (a system prompt) gets the
soonest of their predictions: the daemon keeps each key's most urgent hint, and a DECLINE
never beats another session's PREDICT. Entries are whole chains, root first, so the
daemon knows each key's depth. No I/O here; nothing but observed events goes in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from attnstore.kvstore_client import HintAction
from attnstore_scheduler.lookahead import HintEntry
from attnstore_scheduler.next_use import NEVER, Population, SessionView, is_gone, next_use_seconds

RECENT_GAPS = 8  # a session's gaps kept for its own mean
FAR_SECONDS = 1e7  # what a live session estimated never to return is predicted at


@dataclass
class _Session:
    node: str
    namespace: bytes
    chain: tuple[bytes, ...] = ()
    turns: int = 0
    last_used_at: float = 0.0
    started_at: float | None = None  # a turn is running (or queued) since
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_GAPS))
    expires_at: float = NEVER
    expected_next_at: float | None = None
    over_at: float | None = None
    counted_gone: bool = False  # counted as stopped in the population while idle

    def view(self) -> SessionView:
        return SessionView(
            self.turns,
            self.last_used_at,
            tuple(self.gaps),
            self.expires_at,
            self.expected_next_at,
            self.over_at is not None,
        )


@dataclass(frozen=True)
class Expectation:
    """What an application said of a session's next turn (validation.check_expectation)."""

    next_turn_in_seconds: float | None  # a follow-up expected within this long
    over: bool  # no further turn expected


@dataclass(frozen=True)
class ActivitySettings:
    decline_seconds: float = 600.0  # an ended session's chunks are declined this long
    gone_after_gaps: float = 4.0  # idle this many expected gaps: counted as stopped (learning only)


class SessionActivity:
    def __init__(
        self, settings: ActivitySettings = ActivitySettings(), population: Population | None = None
    ) -> None:
        self._settings = settings
        self.population = population or Population()
        self._sessions: dict[str, _Session] = {}
        self._changed: set[str] = set()  # sessions whose prediction changed since the last predictions()
        self._listeners: list[Callable[[], object]] = []

    def add_listener(self, listener: Callable[[], object]) -> None:
        """Called after every change (the hint pusher's notify)."""
        self._listeners.append(listener)

    def _change(self, session_id: str) -> None:
        self._changed.add(session_id)
        for listener in self._listeners:
            listener()

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def changed(self) -> bool:
        """Whether a session's turn, expectation or end came since the last predictions()."""
        return bool(self._changed)

    def turn_started(self, session_id: str, node: str, namespace: bytes, now: float) -> None:
        self._change(session_id)
        s = self._sessions.get(session_id)
        if s is None or s.over_at is not None:
            self._sessions[session_id] = _Session(node, namespace, started_at=now)
            return
        s.node, s.namespace, s.started_at, s.expected_next_at = node, namespace, now, None
        if s.turns:
            s.gaps.append(max(0.0, now - s.last_used_at))
            self.population.observe_gap(s.gaps[-1])
            if s.counted_gone:
                self.population.observe_stopped(s.turns, undo=True)
                s.counted_gone = False
            self.population.observe_continued(s.turns)

    def turn_ended(
        self,
        session_id: str,
        chain: Sequence[bytes],
        now: float,
        expires_at: float = NEVER,
        node: str | None = None,
        namespace: bytes | None = None,
    ) -> None:
        """The turn's KV is stored as `chain` (root first) on `node` in `namespace` (default:
        where the turn started: a session's first turn learns them only at its end); the TTL
        now ends at `expires_at`."""
        s = self._sessions.get(session_id)
        if s is None:
            return
        self._change(session_id)
        s.node, s.namespace = node or s.node, namespace or s.namespace
        s.chain, s.turns, s.last_used_at, s.started_at, s.expires_at = (
            tuple(chain),
            s.turns + 1,
            now,
            None,
            expires_at,
        )

    def turn_abandoned(self, session_id: str) -> None:
        """The turn failed or was cancelled: the session is idle again, as before it."""
        s = self._sessions.get(session_id)
        if s is not None:
            s.started_at = None

    def expect(self, session_id: str, expectation: Expectation, now: float) -> None:
        """The application's expectation (Chat/CreateSession); weighed above the estimate
        until the session's next turn starts."""
        s = self._sessions.setdefault(session_id, _Session(node="", namespace=b""))
        self._change(session_id)
        seconds = expectation.next_turn_in_seconds
        s.expected_next_at = None if seconds is None else now + seconds
        if expectation.over:
            self.ended(session_id, now)

    def ended(self, session_id: str, now: float) -> None:
        """Deleted, expired, or said over: its chunks are declined from now on."""
        s = self._sessions.get(session_id)
        if s is None or s.over_at is not None:
            return
        self._change(session_id)
        s.over_at = now
        if not s.counted_gone:
            self.population.observe_stopped(s.turns)

    def predictions(self, now: float, changed_only: bool = False) -> dict[str, dict[bytes, list[HintEntry]]]:
        """Hint entries per node and namespace: of every session, or with `changed_only` of
        those changed since the last call (sent between full pushes, so a turn's fresh
        chunks get their prediction at once). A session with a turn under way (queued or
        running) is in use now (0 s; the queue's own hints order the queued ones); ended
        ones are forgotten `decline_seconds` later."""
        plans: dict[str, dict[bytes, list[HintEntry]]] = {}
        names = self._changed if changed_only else self._sessions.keys()
        chosen = [(name, self._sessions[name]) for name in names if name in self._sessions]
        self._changed = set()
        for session_id, s in chosen:
            if s.over_at is not None and now - s.over_at > self._settings.decline_seconds:
                del self._sessions[session_id]
                continue
            if not s.chain or not s.node or not s.namespace:
                continue
            if s.started_at is not None:
                plans.setdefault(s.node, {}).setdefault(s.namespace, []).append(
                    HintEntry(s.chain, HintAction.PREDICT, 0, 0.0)
                )
                continue
            view = s.view()
            self._note_gone(s, view, now)
            if s.over_at is None and now >= s.expires_at:
                self.ended(session_id, now)
            seconds = next_use_seconds(view, now, self.population)
            if s.over_at is not None:
                entry = HintEntry(s.chain, HintAction.DECLINE, 0)
            else:  # only an ended session is declined: one estimated gone may still come back
                entry = HintEntry(s.chain, HintAction.PREDICT, 0, min(seconds, FAR_SECONDS))
            plans.setdefault(s.node, {}).setdefault(s.namespace, []).append(entry)
        return plans

    def _note_gone(self, s: _Session, view: SessionView, now: float) -> None:
        if (
            not s.counted_gone
            and s.over_at is None
            and is_gone(view, now, self.population, self._settings.gone_after_gaps)
        ):
            s.counted_gone = True
            self.population.observe_stopped(s.turns)
