"""pick_home: a session moves to a peer's node only when that peer holds a long enough
leading run of its stored prefix, and never to a peer the ledger does not know."""

from __future__ import annotations

import pytest

from attnstore_scheduler.pool_routing import pick_home

NODES = {"b:1": "node-b", "c:1": "node-c"}  # peer gRPC address -> node, from the ledger


@pytest.mark.parametrize(
    ("places", "min_share", "home"),
    [
        ([], 1.0, "node-a"),  # nothing stored
        (["", "", ""], 1.0, "node-a"),  # all on the owner
        (["b:1", "b:1", "b:1"], 1.0, "node-b"),  # all on one peer
        (["b:1", "b:1", ""], 1.0, "node-a"),  # the owner holds the rest
        (["b:1", "b:1", "b:1", ""], 0.75, "node-b"),  # enough of it, one leading run
        (["b:1", "c:1", "b:1", "b:1"], 0.75, "node-a"),  # node-b's run from the start is 1 of 4
        (["", "b:1", "b:1", "b:1"], 0.5, "node-a"),  # node-b's worker could not read chunk 0
        (["d:1", "d:1"], 1.0, "node-a"),  # a peer the ledger forgot (dead)
    ],
)
def test_the_home_of_a_session(places: list[str], min_share: float, home: str) -> None:
    assert pick_home("node-a", places, NODES, min_share) == home
