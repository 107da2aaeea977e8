"""Session records: ids, their encoding (records stored by older schedulers included), and
which chunks a truncated session still reads."""

from __future__ import annotations

import time

import msgpack
import pytest

from attnstore.errors import InvalidArgument
from attnstore_scheduler.session_record import Message, SessionIds, SessionRecord, check_session_id
from attnstore_scheduler.turn_types import FinishReason


def test_ids_sort_by_creation_time_and_are_checked() -> None:
    new_session_id = SessionIds().new
    ids = [new_session_id(1_700_000_000.0 + step) for step in range(3)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert all(check_session_id(session_id) == session_id for session_id in ids)
    burst = [new_session_id(1_700_000_000.0) for _ in range(50)]  # one millisecond
    assert burst == sorted(burst) and len(set(burst)) == 50
    for bad in ("", "A" * 32, "0" * 31, "g" * 32):
        with pytest.raises(InvalidArgument):
            check_session_id(bad)


def test_a_record_round_trips_through_its_encoding() -> None:
    record = SessionRecord(
        tenant="acme",
        session_id=SessionIds().new(),
        ttl_seconds=60,
        created_at=1.5,
        updated_at=2.5,
        messages=(Message("user", "hi"), Message("assistant", "hello", "length")),
        token_ids=(1, 2, 3),
        closing_tokens=2,
        turns=1,
        truncated_tokens=28,
        sink_tokens=4,
        namespace=bytes(16),
        chunk_keys=(b"a" * 32, b"b" * 32),
        node="node-a",
    )
    assert SessionRecord.decode(record.encode()) == record
    assert record.expires_at == 62.5


def test_a_record_stored_before_answers_were_closed_loads() -> None:
    """No closing_tokens, messages as [role, content] pairs: its next turn renders anew."""
    old = {
        "tenant": "acme",
        "session_id": "0" * 32,
        "ttl_seconds": 60,
        "created_at": 1.0,
        "updated_at": 2.0,
        "messages": [["system", "be brief"], ["user", "hi"], ["assistant", "hello"]],
        "token_ids": [1, 2, 3],
        "turns": 1,
        "truncated_tokens": 0,
        "sink_tokens": 0,
        "namespace": b"",
        "chunk_keys": [],
        "node": "node-a",
    }
    record = SessionRecord.decode(msgpack.packb(old, use_bin_type=True))
    assert record.closing_tokens is None
    assert record.messages[-1] == Message("assistant", "hello", "")
    assert record.messages[-1].finish_reason == ""


def test_stored_finish_reasons_load_as_the_enum_and_unknown_ones_as_unspecified() -> None:
    """A newer replica may store a reason this one does not know: the record still loads."""
    record = SessionRecord("acme", "0" * 32, 60, 1.0, 2.0, (Message("assistant", "a", FinishReason.LENGTH),))
    data = msgpack.unpackb(record.encode(), raw=False)
    assert data["messages"] == [["assistant", "a", "length"]]
    data["messages"].append(["assistant", "b", "content_filter"])
    loaded = SessionRecord.decode(msgpack.packb(data, use_bin_type=True))
    reasons = [message.finish_reason for message in loaded.messages]
    assert reasons == [FinishReason.LENGTH, FinishReason.UNSPECIFIED]
    assert all(type(reason) is FinishReason for reason in reasons)


@pytest.mark.parametrize(
    ("sink_tokens", "truncated_tokens", "readable"),
    [(0, 0, "abcdef"), (4, 28, "acdef"), (4, 44, "adef"), (0, 32, "cdef"), (8, 8, "abcdef")],
)
def test_truncation_leaves_the_dropped_chunks_unread(
    sink_tokens: int, truncated_tokens: int, readable: str
) -> None:
    keys = tuple(letter.encode() * 32 for letter in "abcdef")
    record = SessionRecord(
        "acme",
        "0" * 32,
        60,
        0.0,
        0.0,
        chunk_keys=keys,
        sink_tokens=sink_tokens,
        truncated_tokens=truncated_tokens,
    )
    assert record.readable_chunk_keys(chunk_tokens=16) == tuple(letter.encode() * 32 for letter in readable)


def test_a_new_record_is_created_and_updated_now_with_a_fresh_id() -> None:
    before = time.time()
    ids = SessionIds()  # ids sort by creation only within one maker (two could share a millisecond)
    first, second = (
        SessionRecord.new(ids, "acme", 60),
        SessionRecord.new(ids, "acme", 60, (Message("system", "be brief"),)),
    )
    assert before <= first.created_at == first.updated_at <= time.time()
    assert check_session_id(first.session_id) and first.session_id < second.session_id
    assert (first.tenant, first.ttl_seconds, first.messages, second.messages) == (
        "acme",
        60,
        (),
        (Message("system", "be brief"),),
    )
