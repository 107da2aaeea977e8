"""Where this daemon's chunks went in the pool, kept across its restarts (issue 21).

The peer tier (peer_tier.py) remembers each placement in memory; this journal appends
every placement and every forgotten one to a file beside the namespace file, so a
restarted daemon indexes its chunks on peers again instead of losing them (and leaving
orphans on the lenders). At open the log is replayed, a torn last record (a crash
mid-append) is ignored, and the log is rewritten with only the live placements.

A placement recorded here may be stale (the peer evicted the chunk, or died): reading it
then fails the usual way, TierCopyCorrupt, and the chunk is a miss; never other bytes,
since every layer is checked against its header and the header names the key. Appends
are not fsynced: a crash loses at most the latest placements, which become misses.
"""

from __future__ import annotations

import os
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import BinaryIO

import msgpack
import structlog

log = structlog.get_logger("kvstore_daemon.placement_journal")

_PLACED, _FORGOTTEN = 1, 0


@dataclass(frozen=True)
class Placement:
    key: bytes
    namespace: bytes
    peer: str  # the peer's gRPC address
    size_bytes: int


class PlacementJournal:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: BinaryIO | None = None

    def open(self) -> list[Placement]:
        """The live placements of earlier lives; from now on appends go to a compacted log."""
        live = self._replay()
        tmp = self._path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            for placement in live.values():
                f.write(msgpack.packb([_PLACED, *astuple(placement)]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        self._file = self._path.open("ab")
        return list(live.values())

    def placed(self, placement: Placement) -> None:
        self._append([_PLACED, *astuple(placement)])

    def forgotten(self, key: bytes) -> None:
        self._append([_FORGOTTEN, key])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _append(self, record: list[object]) -> None:
        if self._file is not None:
            self._file.write(msgpack.packb(record))
            self._file.flush()

    def _replay(self) -> dict[bytes, Placement]:
        live: dict[bytes, Placement] = {}
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return live
        unpacker = msgpack.Unpacker(raw=False, use_list=True)
        unpacker.feed(data)
        try:
            for record in unpacker:
                if record[0] == _PLACED:
                    live[record[1]] = Placement(*record[1:])
                else:
                    live.pop(record[1], None)
        except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:  # a torn or foreign tail
            log.warning("placement_journal_tail_ignored", path=str(self._path), error=str(exc))
        return live
