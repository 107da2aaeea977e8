"""An answer's ending between the names the services keep and common.proto's enum.

The worker and the scheduler keep how an answer ended as a lower-case name ("stop",
"stop_string", "length"; "" when not reported): the enum's value names without their
prefix. One mapping for both edges, derived from the enum, so a value added to
common.proto needs no table here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from attnstore.common.v1 import common_pb2 as pb

_PREFIX = "FINISH_REASON_"


class Sample(Protocol):
    """One answer's stats as a service keeps them (worker and scheduler `SampleStats`)."""

    @property
    def generated_tokens(self) -> int: ...

    @property
    def finish_reason(self) -> str: ...


def finish_reason_to_proto(name: str) -> pb.FinishReason.ValueType:
    """ "" is UNSPECIFIED; a name the enum lacks is too (a reason this build cannot name)."""
    try:
        return pb.FinishReason.Value(_PREFIX + name.upper()) if name else pb.FINISH_REASON_UNSPECIFIED
    except ValueError:
        return pb.FINISH_REASON_UNSPECIFIED


def finish_reason_from_proto(value: int) -> str:
    """UNSPECIFIED, and a value this build does not know (a newer peer's), are ""."""
    if value == pb.FINISH_REASON_UNSPECIFIED or value not in pb.FinishReason.values():
        return ""
    return pb.FinishReason.Name(value).removeprefix(_PREFIX).lower()


def samples_to_proto(samples: Iterable[Sample]) -> list[pb.SampleStats]:
    """Each answer's stats, sample_index its place in `samples`."""
    return [
        pb.SampleStats(
            sample_index=index,
            generated_tokens=sample.generated_tokens,
            finish_reason=finish_reason_to_proto(sample.finish_reason),
        )
        for index, sample in enumerate(samples)
    ]
