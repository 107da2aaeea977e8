"""A tier on other daemons (issue 21's placement): copies this daemon places on peers
that have room, instead of deleting them, and reads back over the peers' byte path
(their data plane across nodes, shared memory on the same node).

It implements `Tier`: `store` asks `find_peers` (the ledger's candidates) for peers and
the first that accepts takes the chunk (the debtor/creditor protocol); the tier
remembers where each chunk went (and journals it: placement_journal.py, so a restart
finds its chunks on peers again), so a chunk already placed is not shipped twice. Puts
to a peer are durable, so what a peer holds for others survives the peer's restart. A peer
that died, restarted without the chunk or stopped answering makes `load` raise
TierCopyCorrupt, which the mover treats as a miss: the chunk is recomputed, never served
wrong, since the client verifies every layer's checksum and the header names the key.
Every call is bounded by the client's timeout, so a partitioned peer costs that much.

The TierMover places SSD evictions here (tier_mover.py); peers come from the ledger
(pool_member.py) or the static `pool_peers` setting (docs/kvstore-daemon.md, "The pool").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import grpc
import structlog

from attnstore.chunks.format import Buffer, ChunkFormatError, decode_layout
from attnstore.errors import ServiceError
from attnstore.kvstore_client import AsyncKVStoreClient, DaemonProtocolError, PutResult
from kvstore_daemon.chunk_entry import Chunk, TierName
from kvstore_daemon.namespaces import NamespaceLayout, NamespaceRegistry
from kvstore_daemon.placement_journal import Placement, PlacementJournal
from kvstore_daemon.settings import DaemonSettings
from kvstore_daemon.tier import TierCopyCorrupt, TierFull

log = structlog.get_logger("kvstore_daemon.peer_tier")

FindPeers = Callable[[int], Awaitable[Sequence[str]]]  # bytes to place -> peer addresses, best first
# What a call to a peer may fail with: its status, our checks, the network.
_PEER_ERRORS = (grpc.RpcError, ServiceError, DaemonProtocolError, ChunkFormatError, OSError)


class PeerTier:
    def __init__(
        self,
        capacity_bytes: int,
        find_peers: FindPeers,
        layout_of: Callable[[bytes], NamespaceLayout],
        connect: Callable[[str], AsyncKVStoreClient],
        journal: PlacementJournal | None = None,
        node: str = "",
    ) -> None:
        """`capacity_bytes`: what this daemon may place on peers in all. `connect(address)`
        makes the client of one peer (its timeout bounds every call to it). `journal`:
        where placements are kept across restarts (None: in memory only). `node`: this
        daemon's node, the borrower its peers count the chunks against."""
        self._journal = journal
        self._node = node
        self._capacity_bytes = capacity_bytes
        self._find_peers = find_peers
        self._layout_of = layout_of
        self._connect = connect
        self._clients: dict[str, AsyncKVStoreClient] = {}
        self._registered: set[tuple[str, bytes]] = set()
        self._placed: dict[bytes, tuple[str, int]] = {}  # key -> (peer address, bytes)
        self._used_bytes = 0

    @property
    def name(self) -> TierName:
        return TierName.PEER

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    def has_room(self, size_bytes: int) -> bool:
        return self._used_bytes + size_bytes <= self._capacity_bytes

    def recheck_room(self) -> None:
        """Room is this daemon's own budget; what each peer lends is the ledger's business."""

    def placed_on(self, key: bytes) -> str | None:
        """The peer holding `key`'s copy, for Lookup to report."""
        placed = self._placed.get(key)
        return placed[0] if placed is not None else None

    def restore(self) -> list[Placement]:
        """Adopts the placements an earlier life journaled (before any store); the chunk
        store indexes them again."""
        placements = self._journal.open() if self._journal is not None else []
        for placement in placements:
            self._placed[placement.key] = (placement.peer, placement.size_bytes)
            self._used_bytes += placement.size_bytes
        return placements

    async def store(self, chunk: Chunk, data: Buffer) -> None:
        if chunk.key in self._placed:
            return  # already on a peer: never shipped twice
        if not self.has_room(chunk.size_bytes):
            raise TierFull(f"{self._used_bytes} of {self._capacity_bytes} bytes already placed on peers")
        for address in await self._find_peers(chunk.size_bytes):
            try:
                result = await self._put(address, chunk, data)
            except _PEER_ERRORS as exc:
                log.info("peer_refused", peer=address, key=chunk.key.hex(), error=str(exc))
                continue
            if chunk.key in result.stored or chunk.key in result.already_stored:
                self._placed[chunk.key] = (address, chunk.size_bytes)
                self._used_bytes += chunk.size_bytes
                if self._journal is not None:
                    self._journal.placed(Placement(chunk.key, chunk.namespace, address, chunk.size_bytes))
                return
        raise TierFull(f"no peer took chunk {chunk.key.hex()}")

    async def load(self, chunk: Chunk) -> Buffer:
        placed = self._placed.get(chunk.key)
        if placed is None:
            raise KeyError(chunk.key)
        address, _ = placed
        try:
            (data,) = await self._client(address).get_whole_chunks(chunk.namespace, [chunk.key])
            if decode_layout(data).header.key != chunk.key:
                raise ChunkFormatError("the peer answered with another chunk")
        except _PEER_ERRORS as exc:
            self.forget(chunk.key)
            raise TierCopyCorrupt(f"peer {address} no longer serves chunk {chunk.key.hex()}: {exc}") from exc
        return data

    def discard(self, chunk: Chunk) -> asyncio.Future[None] | None:
        placed = self.forget(chunk.key)
        if placed is None:
            return None
        return asyncio.ensure_future(self._delete(placed[0], chunk))

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        if self._journal is not None:
            self._journal.close()

    def forget(self, key: bytes) -> tuple[str, int] | None:
        """Drops the placement of `key` (its peer no longer holds it); None if none."""
        placed = self._placed.pop(key, None)
        if placed is not None:
            self._used_bytes -= placed[1]
            if self._journal is not None:
                self._journal.forgotten(key)
        return placed

    async def _delete(self, address: str, chunk: Chunk) -> None:
        try:
            await self._client(address).delete(chunk.namespace, [chunk.key])
        except _PEER_ERRORS as exc:  # a dead peer holds nothing; one that lives lets it expire by eviction
            log.info("peer_delete_failed", peer=address, key=chunk.key.hex(), error=str(exc))

    async def _put(self, address: str, chunk: Chunk, data: Buffer) -> PutResult:
        client = self._client(address)
        if (address, chunk.namespace) not in self._registered:
            layout = self._layout_of(chunk.namespace)
            await client.register_namespace(
                chunk.namespace, num_layers=layout.num_layers, kv_heads=layout.kv_heads, head_dim=layout.head_dim,
                chunk_tokens=layout.chunk_tokens, dtype=layout.dtype, model_label=layout.model_label,
            )  # fmt: skip
            self._registered.add((address, chunk.namespace))
        return await client.put_chunks(
            chunk.namespace, [(chunk.key, data)], durable=True, borrower=self._node
        )

    def _client(self, address: str) -> AsyncKVStoreClient:
        if address not in self._clients:
            self._clients[address] = self._connect(address)
        return self._clients[address]


def static_peers(addresses: Sequence[str]) -> FindPeers:
    async def find_peers(size_bytes: int) -> Sequence[str]:
        return addresses

    return find_peers


def make_peer_tier(
    settings: DaemonSettings, namespaces: NamespaceRegistry, find_peers: FindPeers
) -> PeerTier:
    """Peers are called as `pool_channel` says (credentials read now: a bad file stops the start)."""
    credentials = settings.pool_channel.load("pool_channel")
    data_plane_tls = settings.pool_channel.ssl_context()
    return PeerTier(
        settings.pool_capacity_bytes, find_peers, namespaces.get,
        lambda address: AsyncKVStoreClient(
            address, timeout_seconds=settings.pool_peer_timeout_seconds, credentials=credentials,
            data_plane_tls=data_plane_tls,
        ),
        PlacementJournal(settings.ssd_dirs[0] / "peer_placements.log"),
        settings.pool_node_name,
    )  # fmt: skip
