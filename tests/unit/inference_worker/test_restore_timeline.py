"""A restore's timeline: busy time of the loop's reads and the compute thread's work, and
their overlap, from spans that may nest, touch or leave gaps."""

from __future__ import annotations

import pytest

from inference_worker.restore.timeline import Timeline


def timeline(*spans: tuple[str, float, float]) -> Timeline:
    line = Timeline(started=100.0)
    for layer, (part, start, end) in enumerate(spans):
        line.add(part, layer, 100.0 + start, 100.0 + end)
    return line


def test_a_pipelined_restore_overlaps_the_shorter_channel_fully() -> None:
    # reads 0-1, 1-2, 2-3 (+ decodes inside them); projections 1-1.5, 2-2.5, 3-3.5
    line = timeline(
        ("read", 0, 0.9),
        ("decode", 0.9, 1),
        ("read", 1, 2),
        ("read", 2, 3),
        ("project", 1, 1.5),
        ("project", 2, 2.5),
        ("project", 3, 3.5),
    )
    overlap = line.overlap()
    assert overlap.wall_seconds == pytest.approx(3.5)
    assert overlap.io_seconds == pytest.approx(3.0)
    assert overlap.compute_seconds == pytest.approx(1.5)
    assert overlap.both_seconds == pytest.approx(1.0)
    assert overlap.overlap == pytest.approx(1.0 / 1.5)


def test_io_then_compute_one_after_the_other_does_not_overlap() -> None:
    overlap = timeline(("read", 0, 2), ("recompute", 2, 3), ("project", 3, 4)).overlap()
    assert (overlap.io_seconds, overlap.compute_seconds, overlap.both_seconds) == (2, 2, 0)
    assert overlap.overlap == 0.0
    assert overlap.wall_seconds == 4


def test_nested_spans_count_once_and_an_empty_timeline_is_all_overlap() -> None:
    overlap = timeline(("recompute", 0, 4), ("project", 1, 2), ("read", 3, 5)).overlap()
    assert (overlap.compute_seconds, overlap.io_seconds, overlap.both_seconds) == (4, 2, 1)
    assert overlap.overlap == 0.5
    assert Timeline().overlap().overlap == 1.0
