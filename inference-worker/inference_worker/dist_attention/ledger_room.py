"""The peers a long turn's home may place on, proposed by the pool's ledger, and the room
it gives each, capped by the ledger (issue 25: a long context's oldest blocks are placed
on peers through the pool's ledger).

    LongTurns.peer_room_tokens: LedgerRoom.lenders (the lender workers the ledger lists,
        lender_notice.py: same node first, then by their daemons' lendable bytes) beside the
        peers lists ──> each peer's DescribeLending (the worker's own room, and the ledger
        id of the daemon it lends through: pool_daemon) ──> LedgerRoom.cap: the peer's room
        at most what the ledger scores its daemon may lend now

Decisions:
- The worker reads the ledger the daemons publish (long_context.pool_redis_url), not its
  own daemon: the ledger's score is each lender daemon's own limits applied to its last
  heartbeat (pool_ledger.py), which pins far segments' chunks out of (lent_chunks.py).
- A peer whose daemon the ledger does not list (stopped, or silent for its TTL) gets no
  room: nothing is placed where the ledger says nobody lends. A peer without a daemon in
  a ledger (pool_daemon empty) keeps its DescribeLending room: it lends outside any ledger.
- A stale entry (a daemon dead within its TTL) still shows room: the append there is
  refused (UNAVAILABLE) and the home places the segment on the next peer, one refusal.
- No ledger, or Redis not answering: no lender proposed, every peer of the lists keeps
  its DescribeLending room (the lender's daemon still refuses past its limits at the append).
- A lender listed but dead (killed within its TTL) does not answer DescribeLending and gets
  no room: nothing is placed there, it only costs that call (gRPC's retries, ~3 s).
"""

from __future__ import annotations

from collections.abc import Mapping

import redis
import structlog

from attnstore.debt_graph import Edge
from attnstore.pool_debts import read_debts
from attnstore.pool_ledger import read_lendable
from attnstore.pool_lenders import read_lenders

log = structlog.get_logger("dist_attention.ledger_room")


class LedgerRoom:
    def __init__(self, redis_url: str | None, timeout_seconds: float, node: str = "") -> None:
        """`redis_url`: the pool ledger's Redis (None: no ledger, rooms pass unchanged);
        `timeout_seconds`: the longest wait for it (a placement must not hang on it);
        `node`: this worker's (lenders on it come first; "": ranked by room alone)."""
        self._client = None
        if redis_url is not None:
            self._client = redis.Redis.from_url(
                redis_url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds,
                decode_responses=True,
            )  # fmt: skip
        self._node = node

    def lenders(self, own_address: str, count: int) -> list[str]:
        """Up to `count` lender workers the ledger lists, other than `own_address`: on this
        node first (no network hop), then by what their daemons may lend (none: last)."""
        if self._client is None or count == 0:
            return []
        try:
            listed = [lender for lender in read_lenders(self._client) if lender.address != own_address]
        except redis.RedisError as exc:
            log.warning("pool_ledger_unreachable", error=str(exc))
            return []
        listed.sort(
            key=lambda lender: (lender.node != self._node, -(lender.lendable_bytes or 0), lender.address)
        )
        return [lender.address for lender in listed[:count]]

    def lenders_on(self, daemon: str, own_address: str) -> list[str]:
        """The lender workers the ledger lists as lending through `daemon` (its ledger id),
        other than `own_address`: where a dead lender's segments may be attached again
        (lender_siblings.py). Empty without a ledger or when it does not answer."""
        if self._client is None:
            return []
        try:
            listed = read_lenders(self._client)
        except redis.RedisError as exc:
            log.warning("pool_ledger_unreachable", error=str(exc))
            return []
        return sorted(
            lender.address for lender in listed if lender.daemon == daemon and lender.address != own_address
        )

    def debts(self) -> dict[Edge, int] | None:
        """The debt graph the lender workers publish (pool_debts.py), for DGFM; None without
        a ledger or when it does not answer (DGFM then asks the workers themselves)."""
        if self._client is None:
            return None
        try:
            return read_debts(self._client)
        except redis.RedisError as exc:
            log.warning("pool_ledger_unreachable", error=str(exc))
            return None

    def cap(
        self, room_tokens: Mapping[str, int], daemons: Mapping[str, str], bytes_per_token: int
    ) -> dict[str, int]:
        """`room_tokens` (peer -> tokens its worker may hold), each peer with a daemon in
        `daemons` (peer -> its ledger id) capped by what the ledger says that daemon may lend."""
        room = dict(room_tokens)
        named = {peer: daemon for peer, daemon in daemons.items() if daemon and peer in room}
        if self._client is None or not named:
            return room
        try:
            lendable = read_lendable(self._client, named.values())
        except redis.RedisError as exc:
            log.warning("pool_ledger_unreachable", error=str(exc))
            return room
        for peer, daemon in named.items():
            room[peer] = min(room[peer], lendable.get(daemon, 0) // bytes_per_token)
        return room

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
