"""The placement journal: placements and forgettings replay across lives, a torn last
record (a crash mid-append) is ignored, and each open compacts the log."""

from __future__ import annotations

from pathlib import Path

import msgpack

from kvstore_daemon.placement_journal import Placement, PlacementJournal


def placement(index: int, peer: str = "10.0.0.2:50051") -> Placement:
    return Placement(bytes([index]) * 32, b"n" * 16, peer, 1000 + index)


def test_placements_replay_across_lives_and_the_log_is_compacted(tmp_path: Path) -> None:
    path = tmp_path / "peer_placements.log"
    first = PlacementJournal(path)
    assert first.open() == []
    for index in range(4):
        first.placed(placement(index))
    first.forgotten(placement(1).key)
    first.placed(placement(2, peer="10.0.0.3:50051"))  # placed again elsewhere: the last one counts
    first.close()
    second = PlacementJournal(path)
    assert sorted(second.open(), key=lambda p: p.key) == [
        placement(0),
        placement(2, "10.0.0.3:50051"),
        placement(3),
    ]
    second.close()
    size = path.stat().st_size
    third = PlacementJournal(path)
    assert len(third.open()) == 3
    third.close()
    assert path.stat().st_size == size  # only live records are kept


def test_a_torn_last_record_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "peer_placements.log"
    journal = PlacementJournal(path)
    journal.open()
    journal.placed(placement(0))
    journal.placed(placement(1))
    journal.close()
    path.write_bytes(path.read_bytes()[:-7])  # the crash cut the second record
    reopened = PlacementJournal(path)
    assert reopened.open() == [placement(0)]
    reopened.close()


def test_garbage_in_the_log_keeps_what_came_before_it(tmp_path: Path) -> None:
    path = tmp_path / "peer_placements.log"
    journal = PlacementJournal(path)
    journal.open()
    journal.placed(placement(0))
    journal.close()
    path.write_bytes(path.read_bytes() + msgpack.packb([1, b"short"]) + msgpack.packb([0, placement(0).key]))
    reopened = PlacementJournal(path)
    assert reopened.open() == [placement(0)]  # the record of another shape and all after it are ignored
    reopened.close()
