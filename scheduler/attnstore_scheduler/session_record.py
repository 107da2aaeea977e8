"""A session as the stores keep it, its (msgpack) encoding, and session ids.

Ids are 12 hex digits of the creation time in milliseconds then 20 random hex digits:
unique without coordination, and sorting by id sorts by creation time (ListSessions pages
by id). Within one millisecond a process counts the random part up (as monotonic ULIDs
do), so ids it makes in a burst still sort in the order they were made.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

import msgpack

from attnstore.errors import InvalidArgument
from attnstore_scheduler.turn_types import FinishReason

SESSION_ID_PATTERN = re.compile(r"[0-9a-f]{32}")  # fullmatch: `$` accepts a trailing newline
ROLES = ("system", "user", "assistant")


_RANDOM_BITS = 80


class SessionIds:
    """Makes session ids. Remembers the latest id it made, so one instance (one per
    `Sessions`) counts the random part up within a millisecond."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = (0, 0)  # (millis, random part) of the latest id made

    def new(self, now_seconds: float | None = None) -> str:
        millis = int((time.time() if now_seconds is None else now_seconds) * 1000)
        with self._lock:
            last_millis, last_random = self._last
            if millis == last_millis and last_random + 1 < 1 << _RANDOM_BITS:
                random_part = last_random + 1
            else:
                random_part = secrets.randbits(_RANDOM_BITS)
            self._last = (millis, random_part)
        return f"{millis:012x}{random_part:020x}"


def check_session_id(session_id: str, field_name: str = "session_id") -> str:
    if not SESSION_ID_PATTERN.fullmatch(session_id):
        shown = session_id[:40] + ("..." if len(session_id) > 40 else "")
        raise InvalidArgument(f"{field_name} {shown!r} is not a session id (32 lower-case hex characters)")
    return session_id


class Message(NamedTuple):
    role: str  # one of ROLES
    content: str
    # How an answer ended; UNSPECIFIED ("") for the other roles and for answers stored
    # before it was recorded.
    finish_reason: FinishReason = FinishReason.UNSPECIFIED


def _message(role: str, content: str, finish_reason: str = "") -> Message:
    """A stored message (without a finish reason if stored before it was recorded)."""
    try:
        reason = FinishReason(finish_reason)
    except ValueError:  # a newer replica's reason, unknown to this one
        reason = FinishReason.UNSPECIFIED
    return Message(role, content, reason)


@dataclass(frozen=True)
class SessionRecord:
    tenant: str
    session_id: str
    ttl_seconds: int
    created_at: float  # Unix seconds
    updated_at: float  # Unix seconds: the last turn's end (or the creation)
    messages: tuple[Message, ...] = ()  # oldest first
    # Token ids of the whole conversation, chat template applied, each answer's generated
    # ids as its content and the template's closing after them: the next turn's prompt
    # starts with them, so identical history gives identical chunk keys.
    token_ids: tuple[int, ...] = ()
    # The last token_ids that close the last answer and were not generated: no turn ran
    # them yet (the next one prefills them with its message). None: stored by a scheduler
    # that did not close answers; the next turn renders the conversation anew.
    closing_tokens: int | None = None
    turns: int = 0
    truncated_tokens: int = 0  # tokens the worker drops after the sinks (the least it drops next turn)
    sink_tokens: int = 0  # first tokens kept as attention sinks when truncating
    namespace: bytes = b""  # the KV namespace (model, dtype, chunk size, tenant) of chunk_keys
    chunk_keys: tuple[bytes, ...] = ()  # chain keys of the conversation's saved full chunks
    node: str = ""  # the node whose daemon holds the KV; "" before the first turn

    @classmethod
    def new(
        cls, ids: SessionIds, tenant: str, ttl_seconds: int, messages: tuple[Message, ...] = ()
    ) -> SessionRecord:
        """A session created now: a fresh id from `ids` (ordered by time), created and updated now."""
        now = time.time()
        return cls(tenant, ids.new(now), ttl_seconds, created_at=now, updated_at=now, messages=messages)

    @property
    def expires_at(self) -> float:
        return self.updated_at + self.ttl_seconds

    def readable_chunk_keys(self, chunk_tokens: int) -> tuple[bytes, ...]:
        """The chunk keys the next turn reads: truncation leaves chunks 1..k-1 unread (chunk
        0 too without sinks), k = (sink_tokens + truncated_tokens) / chunk_tokens."""
        if not self.truncated_tokens:
            return self.chunk_keys
        first_kept = (self.sink_tokens + self.truncated_tokens) // chunk_tokens
        sinks = self.chunk_keys[:1] if self.sink_tokens else ()
        return (*sinks, *self.chunk_keys[first_kept:])

    def encode(self) -> bytes:
        data = asdict(self)
        data["messages"] = [list(message) for message in self.messages]
        return msgpack.packb(data, use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> SessionRecord:
        data_fields = msgpack.unpackb(data, raw=False)
        # Fields a newer scheduler added are skipped, so replicas can be upgraded one by one.
        known = {f.name for f in fields(cls)}
        values = {name: value for name, value in data_fields.items() if name in known}
        values["messages"] = tuple(_message(*message) for message in values["messages"])
        values["token_ids"] = tuple(values["token_ids"])
        values["chunk_keys"] = tuple(values["chunk_keys"])
        return cls(**values)
