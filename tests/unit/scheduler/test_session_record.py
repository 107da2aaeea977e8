"""Session records: ids, their encoding, and which chunks a truncated session still reads."""

from __future__ import annotations

import pytest

from attnstore.errors import InvalidArgument
from attnstore_scheduler.session_record import SessionRecord, check_session_id, new_session_id


def test_ids_sort_by_creation_time_and_are_checked() -> None:
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
        session_id=new_session_id(),
        ttl_seconds=60,
        created_at=1.5,
        updated_at=2.5,
        messages=(("user", "hi"), ("assistant", "hello")),
        token_ids=(1, 2, 3),
        turns=1,
        truncated_tokens=28,
        sink_tokens=4,
        namespace=bytes(16),
        chunk_keys=(b"a" * 32, b"b" * 32),
        node="node-a",
    )
    assert SessionRecord.decode(record.encode()) == record
    assert record.expires_at == 62.5


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
