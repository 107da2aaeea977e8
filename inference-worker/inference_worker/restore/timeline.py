"""When each part of one restore ran: the event loop's reads and the compute thread's work,
layer by layer, and how much of them overlapped (what the planner's model assumes).

    loop      read l ──decode l──read l+1 ──decode l+1── ...      ("read", "decode")
    compute          project l ─────────── project l+1 ...         ("recompute", "project")

`overlap` is the time both channels were busy over the shorter channel's busy time: 1.0 is
the planner's bubble-free schedule (the restore takes max(io, compute)), 0.0 is IO and
compute one after the other (io + compute).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

LOOP_PARTS = ("read", "decode")  # waiting for a layer's pieces; turning them into tensors
COMPUTE_PARTS = ("recompute", "project")


@dataclass(frozen=True)
class Span:
    part: str  # one of LOOP_PARTS or COMPUTE_PARTS
    layer: int  # the (first) layer it worked on
    start_seconds: float  # since the restore began
    end_seconds: float


@dataclass(frozen=True)
class Overlap:
    wall_seconds: float  # first span's start to last span's end
    io_seconds: float  # the loop busy reading or decoding
    compute_seconds: float  # the compute thread busy
    both_seconds: float  # both at once

    @property
    def overlap(self) -> float:
        """Both-busy time over the shorter channel's (module docstring)."""
        shorter = min(self.io_seconds, self.compute_seconds)
        return self.both_seconds / shorter if shorter > 0 else 1.0

    def as_dict(self) -> dict[str, float]:
        return {
            "wall_seconds": self.wall_seconds,
            "io_seconds": self.io_seconds,
            "compute_seconds": self.compute_seconds,
            "both_seconds": self.both_seconds,
            "overlap": self.overlap,
        }


@dataclass
class Timeline:
    started: float = field(default_factory=time.perf_counter)
    spans: list[Span] = field(default_factory=list)

    def add(self, part: str, layer: int, start: float, end: float) -> None:
        """A span between perf_counter() readings `start` and `end` (list.append: safe from
        the loop and the compute thread alike)."""
        self.spans.append(Span(part, layer, start - self.started, end - self.started))

    def overlap(self) -> Overlap:
        io = _union(s for s in self.spans if s.part in LOOP_PARTS)
        compute = _union(s for s in self.spans if s.part in COMPUTE_PARTS)
        wall = max((s.end_seconds for s in self.spans), default=0.0) - min(
            (s.start_seconds for s in self.spans), default=0.0
        )
        return Overlap(wall, _length(io), _length(compute), _length(_intersect(io, compute)))


Intervals = list[tuple[float, float]]  # sorted, disjoint


def _union(spans: Iterable[Span]) -> Intervals:
    merged: Intervals = []
    for start, end in sorted((s.start_seconds, s.end_seconds) for s in spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals: Intervals) -> float:
    return sum(end - start for start, end in intervals)
