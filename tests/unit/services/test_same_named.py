from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel

from attnstore.common.v1 import common_pb2
from attnstore.same_named import field_names, same_named


@dataclass(frozen=True)
class Limits:
    max_chars: int
    ttl_seconds: int = 60
    derived: int = field(default=0, init=False)


class Settings(BaseModel):
    max_chars: int = 10
    ttl_seconds: int = 5
    other: str = "unrelated"


@dataclass(frozen=True)
class Stats:
    sample_index: int
    generated_tokens: int
    finish_reason: int


def test_copies_every_field_by_name_and_leaves_out_what_init_does_not_take() -> None:
    assert field_names(Limits) == ("max_chars", "ttl_seconds")
    assert same_named(Limits, Settings()) == Limits(max_chars=10, ttl_seconds=5)


def test_changed_fields_win_over_the_source() -> None:
    assert same_named(Limits, Settings(), ttl_seconds=99) == Limits(max_chars=10, ttl_seconds=99)


def test_a_field_the_source_lacks_is_named() -> None:
    with pytest.raises(AttributeError, match="max_chars"):
        same_named(Limits, Stats(0, 1, 2))


def test_builds_protobuf_messages_and_reads_them() -> None:
    message = same_named(
        common_pb2.SampleStats,
        Stats(sample_index=1, generated_tokens=7, finish_reason=common_pb2.FINISH_REASON_LENGTH),
    )
    assert message == common_pb2.SampleStats(
        sample_index=1, generated_tokens=7, finish_reason=common_pb2.FINISH_REASON_LENGTH
    )
    assert same_named(Stats, message) == Stats(1, 7, common_pb2.FINISH_REASON_LENGTH)


def test_pydantic_targets_and_unknown_kinds() -> None:
    assert same_named(Settings, Limits(max_chars=3), other="x") == Settings(
        max_chars=3, ttl_seconds=60, other="x"
    )
    with pytest.raises(TypeError, match="not a dataclass"):
        field_names(int)
