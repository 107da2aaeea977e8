"""The workers that lend memory to long contexts, listed beside the daemons in the pool's
ledger (issue 25: the ledger proposes lenders, so a long turn's home needs no peers list).

    attnstore:pool:lender:<address>  hash {daemon, node} of a worker whose MicroAttention
                                     other workers reach at <address>; PEXPIRE = its TTL
    attnstore:pool:lenders           set of those addresses (an index: a member whose hash
                                     expired is dropped by the next read)

A lender worker renews its entry well within its TTL (lender_notice.py) and deletes it when
it stops cleanly; one killed is listed until the TTL passes. `daemon` is the ledger id of
the daemon it lends through (its `pool_daemon`; empty: it lends outside the ledger), so a
home ranks the lenders by what their daemons may lend (`attnstore:pool:lendable`).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
import redis.asyncio as aioredis

from attnstore.pool_ledger import read_lendable

_LENDERS = "attnstore:pool:lenders"


def _lender_key(address: str) -> str:
    return f"attnstore:pool:lender:{address}"


@dataclass(frozen=True)
class Lender:
    address: str  # host:port of its MicroAttention, as other workers reach it
    daemon: str  # ledger id of the daemon it lends through; "": none
    node: str  # the host it runs on (locality)
    lendable_bytes: int | None  # what its daemon may lend now (None: no daemon in the ledger)


async def publish_lender(
    client: aioredis.Redis, address: str, daemon: str, node: str, ttl_seconds: float
) -> None:
    """Lists (or renews) the worker at `address` as a lender for `ttl_seconds`."""
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset(_lender_key(address), mapping={"daemon": daemon, "node": node})
        pipe.pexpire(_lender_key(address), int(ttl_seconds * 1000))
        pipe.sadd(_LENDERS, address)
        await pipe.execute()


async def withdraw_lender(client: aioredis.Redis, address: str) -> None:
    """A lender that stops cleanly leaves at once rather than after its TTL."""
    async with client.pipeline(transaction=True) as pipe:
        pipe.delete(_lender_key(address))
        pipe.srem(_LENDERS, address)
        await pipe.execute()


def read_lenders(client: redis.Redis) -> list[Lender]:
    """Every listed lender, with what its daemon may lend (its entries whose TTL passed are
    dropped from the index). Synchronous, for a worker thread (a long turn's placement);
    `client` decodes responses (decode_responses=True)."""
    addresses = sorted(client.smembers(_LENDERS))
    with client.pipeline(transaction=False) as pipe:
        for address in addresses:
            pipe.hgetall(_lender_key(address))
        found = pipe.execute()
    live = {address: fields for address, fields in zip(addresses, found, strict=True) if fields}
    if stale := [a for a in addresses if a not in live]:
        client.srem(_LENDERS, *stale)  # one renewed meanwhile is re-added by its next renewal
    lendable = read_lendable(client, [f["daemon"] for f in live.values() if f["daemon"]])
    return [
        Lender(address, f["daemon"], f["node"], lendable.get(f["daemon"]) if f["daemon"] else None)
        for address, f in live.items()
    ]
