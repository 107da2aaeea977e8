"""The debt graph of DGFM in the pool's ledger (issue 25: DGFM builds the graph from the
ledger, an edge from debtor to creditor; debt_graph.py plans the swaps).

    attnstore:pool:debts:<creditor>  hash <debtor> -> bytes of the debtor's KV the creditor
                                     holds now; PEXPIRE = the creditor's lender TTL
    attnstore:pool:creditors         set of those creditors (an index: a member whose hash
                                     expired or emptied is dropped by the next read)

A node is a worker's advertised address (the name its segments carry as their home). Each
lender worker writes its own hash, whole, when what it holds changes and at each renewal
of its lender entry (lender_notice.py): absolute values with a TTL, not increments, so a
lender killed -9 takes its edges with it when the TTL passes, and a lost or repeated write
leaves nothing wrong behind (the next one replaces it).
"""

from __future__ import annotations

from collections.abc import Mapping

import redis
import redis.asyncio as aioredis

from attnstore.pool_ledger import redis_text

_CREDITORS = "attnstore:pool:creditors"


def _debts_key(creditor: str) -> str:
    return f"attnstore:pool:debts:{creditor}"


async def publish_debts(
    client: aioredis.Redis, creditor: str, held_for: Mapping[str, int], ttl_seconds: float
) -> None:
    """`creditor` holds `held_for` (debtor -> bytes) now, for `ttl_seconds` unless rewritten;
    replaces what it published before (an empty `held_for`: it holds nothing)."""
    owed = {debtor: size for debtor, size in held_for.items() if size > 0}
    async with client.pipeline(transaction=True) as pipe:
        pipe.delete(_debts_key(creditor))
        if owed:
            pipe.hset(_debts_key(creditor), mapping=owed)
            pipe.pexpire(_debts_key(creditor), int(ttl_seconds * 1000))
            pipe.sadd(_CREDITORS, creditor)
        else:
            pipe.srem(_CREDITORS, creditor)
        await pipe.execute()


async def withdraw_debts(client: aioredis.Redis, creditor: str) -> None:
    """A lender that stops cleanly holds nothing any more: its edges go at once."""
    await publish_debts(client, creditor, {}, ttl_seconds=0)


def read_debts(client: redis.Redis) -> dict[tuple[str, str], int]:
    """(debtor, creditor) -> bytes, every edge the live creditors published (a creditor
    whose hash expired leaves the index). Synchronous, for a worker thread (a DGFM round)."""
    creditors = sorted(redis_text(c) for c in client.smembers(_CREDITORS))
    with client.pipeline(transaction=False) as pipe:
        for creditor in creditors:
            pipe.hgetall(_debts_key(creditor))
        found = pipe.execute()
    if stale := [c for c, fields in zip(creditors, found, strict=True) if not fields]:
        client.srem(_CREDITORS, *stale)  # one rewritten meanwhile is re-added by its next write
    debts: dict[tuple[str, str], int] = {}
    for creditor, fields in zip(creditors, found, strict=True):
        debts.update(edges(creditor, fields))
    return debts


def edges(creditor: str, fields: Mapping[bytes, bytes] | Mapping[str, str]) -> dict[tuple[str, str], int]:
    """A creditor's hash as edges (debtor, creditor) -> bytes; a zero or negative value is
    no debt. Clients with and without decode_responses both work."""
    return {(redis_text(debtor), creditor): int(size) for debtor, size in fields.items() if int(size) > 0}
