"""The pool's ledger in the scheduler's Redis (issue 21, the global manager of
Infinite-LLM): which daemons exist, where their data planes listen, and how much each
may lend. Daemons write their own entries and ask it for peers (kvstore_daemon's
pool_member.py); the scheduler may read it for routing. Needs redis-py, which the daemon
and the scheduler install.

    attnstore:pool:daemon:<id>   hash of a DaemonEntry; PEXPIRE = heartbeat_ttl_seconds
    attnstore:pool:lendable      sorted set <id> scored by the bytes it may lend now
    attnstore:pool:dropped:<node>  list of msgpack [lender id, key]: borrowed chunks a lender
                                 evicted, for the borrower node's daemons to forget (their
                                 heartbeats drain it); EXPIRE = DROPPED_TTL_SECONDS

A daemon's heartbeat rewrites both (one MULTI); a daemon that misses heartbeats for the
TTL loses its hash, and the next `candidates` call drops its stale score, so the ledger
forgets a dead peer without a sweeper. What a daemon may lend keeps a floor of its
capacity for its own node and a ceiling on what it holds for others. Long turns' homes
(inference workers) read the scores of their peers' daemons (`read_lendable`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import msgpack
import redis
import redis.asyncio as aioredis

_PREFIX = "attnstore:pool"
_LENDABLE = f"{_PREFIX}:lendable"
_CANDIDATE_SCAN = 4  # scores read per candidate wanted: room for stale and own entries
# A borrower gone longer than this finds out on read instead (a failed read, then a miss).
DROPPED_TTL_SECONDS = 3600


def _daemon_key(daemon_id: str) -> str:
    return f"{_PREFIX}:daemon:{daemon_id}"


def _dropped_key(node: str) -> str:
    return f"{_PREFIX}:dropped:{node}"


@dataclass(frozen=True)
class DaemonEntry:
    daemon_id: str
    node: str
    grpc_address: str
    data_plane_address: str  # host:port of its data plane
    capacity_bytes: int  # its SSD tier: the one borrowed chunks take
    free_bytes: int
    lent_bytes: int  # bytes it holds for other daemons
    # Of them, pinned ones (far segments' KV a worker attends, lent_chunks.py): never replaced.
    pinned_lent_bytes: int = 0


@dataclass(frozen=True)
class LendingLimits:
    """A daemon's lending, from its settings (DaemonSettings.lending_limits, the one source)."""

    own_floor_fraction: float  # of capacity kept free for its own node's chunks
    max_lent_fraction: float  # of capacity it may hold for other daemons
    # A lender at its limits makes room for a newer borrowed chunk by evicting older ones
    # (their borrowers are told): the room lent turns over as one LRU over the pool would,
    # instead of keeping the first chunks placed and refusing every later one.
    replace_borrowed: bool

    def lendable_bytes(self, entry: DaemonEntry) -> int:
        replaceable = replaceable_bytes(entry) if self.replace_borrowed else 0
        return self.more_lendable_bytes(entry.capacity_bytes, entry.free_bytes, entry.lent_bytes, replaceable)

    def more_lendable_bytes(
        self, capacity_bytes: int, free_bytes: int, lent_bytes: int, replaceable: int = 0
    ) -> int:
        """What a daemon may take for others on top of what it lends: its free room above
        its floor, up to its ceiling; `replaceable` bytes of what it lends count as room
        too (borrowed chunks it would evict: not the pinned ones). The ledger ranks lenders
        by it; the lender checks a borrowed chunk against it with none replaceable, after
        evicting borrowed chunks if it replaces (ChunkStore.reserve)."""
        above_floor = free_bytes + replaceable - int(capacity_bytes * self.own_floor_fraction)
        below_ceiling = int(capacity_bytes * self.max_lent_fraction) - lent_bytes + replaceable
        return max(0, min(above_floor, below_ceiling))


class PoolLedger:
    def __init__(
        self, client: aioredis.Redis, heartbeat_ttl_seconds: float, limits: LendingLimits | None
    ) -> None:
        """`limits`: the daemon's own, by which it scores itself and ranks lenders; None: a
        reader, which does neither (each daemon's limits are its settings, not the reader's)."""
        self._redis = client
        self._ttl_ms = int(heartbeat_ttl_seconds * 1000)
        self._limits = limits

    @classmethod
    def reader(cls, client: aioredis.Redis) -> PoolLedger:
        """A ledger that is only read (the scheduler's routing): it never heartbeats."""
        return cls(client, heartbeat_ttl_seconds=0.0, limits=None)

    def _lending(self) -> LendingLimits:
        if self._limits is None:
            raise RuntimeError("a read-only ledger (PoolLedger.reader) neither heartbeats nor ranks lenders")
        return self._limits

    async def heartbeat(self, entry: DaemonEntry) -> None:
        """Registers the daemon, or renews it with its current free space."""
        fields = {name: str(value) for name, value in asdict(entry).items()}
        lendable = self._lending().lendable_bytes(entry)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(_daemon_key(entry.daemon_id), mapping=fields)
            pipe.pexpire(_daemon_key(entry.daemon_id), self._ttl_ms)
            pipe.zadd(_LENDABLE, {entry.daemon_id: lendable})
            await pipe.execute()

    async def forget(self, daemon_id: str) -> None:
        """A daemon that stops cleanly leaves at once rather than after its TTL."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(_daemon_key(daemon_id))
            pipe.zrem(_LENDABLE, daemon_id)
            await pipe.execute()

    async def report_dropped(self, lender: str, drops: Sequence[tuple[str, bytes]]) -> None:
        """Lender `lender` (its daemon id) no longer holds these (borrower node, key) chunks."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for node in {node for node, _ in drops}:
                pipe.rpush(
                    _dropped_key(node), *(msgpack.packb([lender, key]) for n, key in drops if n == node)
                )
                pipe.expire(_dropped_key(node), DROPPED_TTL_SECONDS)
            await pipe.execute()

    async def take_dropped(self, node: str) -> list[tuple[str, bytes]]:
        """(lender id, key) of every chunk lenders dropped for borrower `node` since the last
        call; they are gone from the ledger once taken."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.lrange(_dropped_key(node), 0, -1)
            pipe.delete(_dropped_key(node))
            records, _ = await pipe.execute()
        drops = []
        for record in records:
            lender, key = msgpack.unpackb(record)
            drops.append((str(lender), bytes(key)))
        return drops

    async def entry(self, daemon_id: str) -> DaemonEntry | None:
        return _decode(await self._redis.hgetall(_daemon_key(daemon_id)))

    async def members(self) -> list[DaemonEntry]:
        """Every live daemon (the scheduler's routing maps peer addresses to nodes with it)."""
        ids = [redis_text(i) for i in await self._redis.zrange(_LENDABLE, 0, -1)]
        async with self._redis.pipeline(transaction=False) as pipe:
            for daemon_id in ids:
                pipe.hgetall(_daemon_key(daemon_id))
            found = await pipe.execute()
        return [entry for fields in found if (entry := _decode(fields)) is not None]

    async def candidates(self, requester: DaemonEntry, size_bytes: int, count: int) -> list[DaemonEntry]:
        """Up to `count` live daemons other than `requester` that may lend `size_bytes`:
        another daemon on the same node first (no network hop), then by room."""
        limits = self._lending()
        ids = await self._redis.zrevrangebyscore(
            _LENDABLE, "+inf", size_bytes, start=0, num=count * _CANDIDATE_SCAN
        )
        ids = [redis_text(i) for i in ids if redis_text(i) != requester.daemon_id]
        async with self._redis.pipeline(transaction=False) as pipe:
            for daemon_id in ids:
                pipe.hgetall(_daemon_key(daemon_id))
            found = await pipe.execute()
        live, stale = [], []
        for daemon_id, fields in zip(ids, found, strict=True):
            entry = _decode(fields)
            (live if entry is not None else stale).append(entry or daemon_id)
        if stale:
            await self._redis.zrem(_LENDABLE, *stale)
        # Free room before room that evicting borrowed chunks would make.
        live.sort(key=lambda e: (
            e.node != requester.node,
            -limits.more_lendable_bytes(e.capacity_bytes, e.free_bytes, e.lent_bytes),
            -limits.more_lendable_bytes(e.capacity_bytes, e.free_bytes, e.lent_bytes, replaceable_bytes(e)),
        ))  # fmt: skip
        return live[:count]


def replaceable_bytes(entry: DaemonEntry) -> int:
    """What a daemon lends that it may evict for a newer loan (the unpinned part)."""
    return max(0, entry.lent_bytes - entry.pinned_lent_bytes)


def read_lendable(client: redis.Redis, daemon_ids: Iterable[str]) -> dict[str, int]:
    """Bytes each daemon of `daemon_ids` may lend now, as its last heartbeat scored it (its
    own limits); a daemon gone from the ledger (stopped, or silent for its TTL) is left
    out. Synchronous, for a worker thread (a long turn's placement, long_turn.py)."""
    ids = list(dict.fromkeys(daemon_ids))
    with client.pipeline(transaction=False) as pipe:
        for daemon_id in ids:
            pipe.exists(_daemon_key(daemon_id))
            pipe.zscore(_LENDABLE, daemon_id)
        found = pipe.execute()
    return {
        daemon_id: int(score)
        for daemon_id, live, score in zip(ids, found[::2], found[1::2], strict=True)
        if live and score is not None
    }


def redis_text(value: bytes | str) -> str:
    """Clients with and without decode_responses both work."""
    return value.decode() if isinstance(value, bytes) else value


def _decode(fields: dict[bytes, bytes] | dict[str, str]) -> DaemonEntry | None:
    if not fields:
        return None
    text = {redis_text(k): redis_text(v) for k, v in fields.items()}
    return DaemonEntry(
        daemon_id=text["daemon_id"], node=text["node"], grpc_address=text["grpc_address"],
        data_plane_address=text["data_plane_address"], capacity_bytes=int(text["capacity_bytes"]),
        free_bytes=int(text["free_bytes"]), lent_bytes=int(text["lent_bytes"]),
        pinned_lent_bytes=int(text.get("pinned_lent_bytes", 0)),
    )  # fmt: skip
