"""One mapping of an answer's ending between the services' names and common.proto."""

from dataclasses import dataclass

import pytest

from attnstore.common.v1 import common_pb2 as pb
from attnstore.finish_reasons import finish_reason_from_proto, finish_reason_to_proto, samples_to_proto


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("", pb.FINISH_REASON_UNSPECIFIED),
        ("stop", pb.FINISH_REASON_STOP),
        ("stop_string", pb.FINISH_REASON_STOP_STRING),
        ("length", pb.FINISH_REASON_LENGTH),
    ],
)
def test_names_and_values_map_both_ways(name: str, value: int) -> None:
    assert finish_reason_to_proto(name) == value
    assert finish_reason_from_proto(value) == name


def test_unknown_names_and_values_are_unspecified() -> None:
    assert finish_reason_to_proto("unspecified_by_this_build") == pb.FINISH_REASON_UNSPECIFIED
    assert finish_reason_from_proto(99) == ""  # a newer peer's value


@dataclass(frozen=True)
class _Sample:
    generated_tokens: int
    finish_reason: str


def test_samples_take_their_index_from_their_place() -> None:
    samples = samples_to_proto([_Sample(4, "length"), _Sample(2, "stop")])
    assert [(s.sample_index, s.generated_tokens, s.finish_reason) for s in samples] == [
        (0, 4, pb.FINISH_REASON_LENGTH),
        (1, 2, pb.FINISH_REASON_STOP),
    ]
