"""A home whose ledger (Redis) does not answer places by its peers' DescribeLending room
alone (ledger_room.py), as without a ledger, and takes no lender from it: a refused
connection, nothing hangs."""

from __future__ import annotations

from attnstore.server.ports import free_port
from inference_worker.dist_attention.ledger_room import LedgerRoom

ROOM = {"a:1": 500, "b:1": 400}


def test_an_unreachable_ledger_leaves_the_workers_room() -> None:
    ledger = LedgerRoom(f"redis://127.0.0.1:{free_port()}", timeout_seconds=2)
    assert ledger.cap(ROOM, {"a:1": "daemon-a:7000", "b:1": ""}, bytes_per_token=768) == ROOM
    assert ledger.lenders("home:1", count=16) == []
    ledger.close()


def test_peers_lending_outside_any_ledger_keep_their_room() -> None:
    assert LedgerRoom(None, timeout_seconds=2).cap(ROOM, {"a:1": "daemon-a:7000"}, 768) == ROOM
    assert LedgerRoom(None, timeout_seconds=2).lenders("home:1", count=16) == []
