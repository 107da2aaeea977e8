"""Remote micro-attention or pull the KV: decided per call from measured costs.

Remote: one round trip carrying the queries and the partials, plus the peer's compute
(which grows with its load; the measured call time includes both). Pull: the segment's KV
of the layer over the link at the measured bandwidth, a round trip, plus the attention
computed here (measured when pulling; until then taken as the peer's). Both estimates are moving averages of what the segment's calls actually took; the
link's bandwidth is first measured by the segment's upload. A peer that refuses the compute
(RESOURCE_EXHAUSTED, over its lending threshold) is pulled from for `refusal_backoff_calls`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

_SMOOTHING = 0.3  # weight of the newest measurement


class Mode(Enum):
    REMOTE = "remote"
    PULL = "pull"


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1 - _SMOOTHING) * old + _SMOOTHING * new


@dataclass
class CostModel:
    refusal_backoff_calls: int = 64
    bandwidth_bytes_per_second: float | None = None
    remote_call_seconds: float | None = None
    remote_compute_seconds: float | None = None  # the peer's attention, as it reports it
    local_compute_seconds: float | None = None  # the same attention here, after a pull
    round_trip_seconds: float | None = None
    _refused_for: int = 0

    def observe_transfer(self, nbytes: int, seconds: float) -> None:
        if seconds > 0 and nbytes > 0:
            self.bandwidth_bytes_per_second = _ewma(self.bandwidth_bytes_per_second, nbytes / seconds)

    def observe_remote(self, call_seconds: float, compute_seconds: float) -> None:
        self.remote_call_seconds = _ewma(self.remote_call_seconds, call_seconds)
        self.remote_compute_seconds = _ewma(self.remote_compute_seconds, compute_seconds)
        self.round_trip_seconds = _ewma(self.round_trip_seconds, max(0.0, call_seconds - compute_seconds))

    def observe_pull(self, nbytes: int, transfer_seconds: float, compute_seconds: float) -> None:
        self.observe_transfer(nbytes, transfer_seconds)
        self.local_compute_seconds = _ewma(self.local_compute_seconds, compute_seconds)

    def observe_refusal(self) -> None:
        self._refused_for = self.refusal_backoff_calls

    def pull_seconds(self, kv_bytes: int) -> float | None:
        if self.bandwidth_bytes_per_second is None:
            return None
        here = self.local_compute_seconds
        compute = here if here is not None else self.remote_compute_seconds
        return (
            (self.round_trip_seconds or 0.0) + kv_bytes / self.bandwidth_bytes_per_second + (compute or 0.0)
        )

    def choose(self, kv_bytes: int) -> Mode:
        """`kv_bytes`: what pulling this layer of the segment would move."""
        if self._refused_for > 0:
            self._refused_for -= 1
            return Mode.PULL
        pull = self.pull_seconds(kv_bytes)
        if self.remote_call_seconds is None or pull is None:
            return Mode.REMOTE  # nothing measured yet: the cheap-in-bytes side
        return Mode.PULL if pull < self.remote_call_seconds else Mode.REMOTE
