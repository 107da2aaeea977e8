"""Pool-aware affinity (issue 21): the node a session's turn should run on, when its
daemon placed the session's chunks on pool peers.

A session's KV is indexed by the daemon of the node that ran its last turn (the owner):
a worker there reads every chunk, those on peers straight from the peers (the worker's
peer fetch). A worker on a peer's node reads only what that peer's daemon holds itself,
from the start of the chain: its own Lookup knows nothing of the owner's chunks. So the
turn moves to a peer's node only when that peer holds at least `min_share` of the prefix
the owner can serve, as one leading run (by default all of it: then every byte is read
from local memory instead of across the network, and nothing is recomputed).

Peer addresses (from the owner's Lookup) map to nodes through the pool's ledger, so a
dead peer (gone from the ledger) is never chosen. Any failure keeps the owner: routing
is a hint, the turn runs either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc
import structlog
from redis.exceptions import RedisError

from attnstore.errors import ServiceError
from attnstore.pool_ledger import PoolLedger
from attnstore_scheduler import metrics
from attnstore_scheduler.worker_registry import WorkerRegistry

log = structlog.get_logger("attnstore_scheduler.pool_routing")


def pick_home(owner: str, places: Sequence[str], node_of: Mapping[str, str], min_share: float) -> str:
    """`places`: per hit of the owner's Lookup, the peer holding it ("" = the owner).
    The peer's node if its leading run is at least `min_share` of the hits, else `owner`."""
    if not places or not places[0] or places[0] not in node_of:
        return owner
    home = node_of[places[0]]
    run = next((i for i, place in enumerate(places) if node_of.get(place) != home), len(places))
    return home if run >= min_share * len(places) else owner


class PoolRouting:
    def __init__(self, registry: WorkerRegistry, ledger: PoolLedger, min_share: float) -> None:
        self._registry = registry
        self._ledger = ledger
        self._min_share = min_share

    async def home(self, owner: str | None, namespace: bytes, keys: Sequence[bytes]) -> str | None:
        """Where the turn over `keys` should run: `owner` (the node that indexes them) or
        the peer node that holds them (see the module doc)."""
        client = self._registry.daemon(owner) if owner else None
        if owner is None or client is None or not keys:
            return owner
        try:
            found = await client.lookup(namespace, keys)
            if not any(found.peers):
                return owner
            node_of = {entry.grpc_address: entry.node for entry in await self._ledger.members()}
        except (grpc.aio.AioRpcError, ServiceError, RedisError) as exc:
            log.info("pool_routing_skipped", node=owner, error=str(exc))
            return owner
        home = pick_home(owner, found.peers, node_of, self._min_share)
        if home != owner:
            metrics.POOL_MOVES.inc()
            log.debug("pool_home", owner=owner, home=home, chunks=found.prefix_length)
        return home
