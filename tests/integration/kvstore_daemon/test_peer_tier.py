"""The peer tier against real peer daemons on loopback (each with its own directories and
ports, standing for nodes), reached over their data planes: the first peer that accepts
takes a chunk, reads are byte-identical, a chunk is not shipped twice, and a peer that
is killed or forgets the chunk yields a miss (TierCopyCorrupt), never other bytes."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest
from service_probes import free_port

from attnstore.kvstore_client import AsyncKVStoreClient, KVStoreClient
from kvstore_daemon.chunk_entry import Chunk, TierName
from kvstore_daemon.namespaces import NamespaceLayout
from kvstore_daemon.peer_tier import PeerTier
from kvstore_daemon.tier import TierCopyCorrupt, TierFull

if TYPE_CHECKING:
    from conftest import ChunkSet, DaemonFactory, DaemonProcess

NAMESPACE = b"peer-tier-tests!"


def _tier(chunks: ChunkSet, peers: Sequence[str], capacity_bytes: int = 1 << 30) -> PeerTier:
    layout = NamespaceLayout(**chunks.layout)

    async def find_peers(size_bytes: int) -> Sequence[str]:
        return peers

    return PeerTier(
        capacity_bytes,
        find_peers,
        lambda namespace: layout,
        lambda address: AsyncKVStoreClient(address, use_shm=False, timeout_seconds=3.0),
    )


def _chunk(chunks: ChunkSet, index: int) -> Chunk:
    return Chunk(chunks.key(index), NAMESPACE, len(chunks.data(index)))


def _holds(peer: DaemonProcess, chunks: ChunkSet, index: int) -> bool:
    with KVStoreClient(peer.address, use_shm=False) as client:
        return client.lookup(NAMESPACE, [chunks.key(index)]).prefix_length == 1


@pytest.fixture
def peers(daemon_factory: DaemonFactory) -> list[DaemonProcess]:
    return [daemon_factory(DATA_PLANE_PORT=free_port()) for _ in range(2)]


def test_placed_chunks_come_back_byte_identical_from_the_peer_that_took_them(
    peers: list[DaemonProcess], chunk_set: type[ChunkSet]
) -> None:
    chunks = chunk_set(NAMESPACE, num_layers=4, seed=5)
    dead = f"127.0.0.1:{free_port()}"  # a candidate that refuses: the next one takes the chunk

    async def scenario() -> None:
        tier = _tier(chunks, [dead, peers[1].address, peers[0].address])
        assert tier.name is TierName.PEER
        for index in range(3):
            await tier.store(_chunk(chunks, index), chunks.data(index))
        await tier.store(_chunk(chunks, 0), chunks.data(0))  # already placed: not shipped again
        assert tier.used_bytes == sum(len(chunks.data(i)) for i in range(3))
        assert {tier.placed_on(chunks.key(i)) for i in range(3)} == {peers[1].address}
        assert [bytes(await tier.load(_chunk(chunks, i))) for i in range(3)] == [
            chunks.data(i) for i in range(3)
        ]
        unlinking = tier.discard(_chunk(chunks, 2))
        assert unlinking is not None
        await unlinking
        assert tier.used_bytes == sum(len(chunks.data(i)) for i in range(2))
        with pytest.raises(KeyError):
            await tier.load(_chunk(chunks, 2))
        await tier.close()

    asyncio.run(scenario())
    assert [_holds(peers[1], chunks, i) for i in range(3)] == [True, True, False]
    with KVStoreClient(peers[0].address) as client:  # the first peer that accepted took all
        assert client.stats().dram.chunks == 0


def test_a_killed_peer_or_a_lost_chunk_is_a_miss(
    peers: list[DaemonProcess], chunk_set: type[ChunkSet]
) -> None:
    chunks = chunk_set(NAMESPACE, num_layers=4, seed=6)

    async def scenario() -> None:
        tier = _tier(chunks, [peers[0].address])
        await tier.store(_chunk(chunks, 0), chunks.data(0))
        await tier.store(_chunk(chunks, 1), chunks.data(1))
        async with AsyncKVStoreClient(peers[0].address, use_shm=False) as client:  # the peer loses chunk 1
            await client.delete(NAMESPACE, [chunks.key(1)])
        with pytest.raises(TierCopyCorrupt, match="no longer serves"):
            await tier.load(_chunk(chunks, 1))
        assert tier.placed_on(chunks.key(1)) is None  # forgotten: never asked again
        peers[0].kill9()
        with pytest.raises(TierCopyCorrupt):
            await tier.load(_chunk(chunks, 0))
        assert tier.used_bytes == 0
        with pytest.raises(TierFull, match="no peer took"):
            await tier.store(_chunk(chunks, 2), chunks.data(2))
        await tier.close()

    asyncio.run(scenario())


def test_the_budget_of_bytes_placed_on_peers_is_kept(
    peers: list[DaemonProcess], chunk_set: type[ChunkSet]
) -> None:
    chunks = chunk_set(NAMESPACE, num_layers=4, seed=7)

    async def scenario() -> None:
        tier = _tier(chunks, [peers[0].address], capacity_bytes=len(chunks.data(0)))
        await tier.store(_chunk(chunks, 0), chunks.data(0))
        assert not tier.has_room(1)
        with pytest.raises(TierFull):
            await tier.store(_chunk(chunks, 1), chunks.data(1))
        await tier.close()

    asyncio.run(scenario())


def test_a_partitioned_peer_costs_a_bounded_timeout(
    peers: list[DaemonProcess], chunk_set: type[ChunkSet]
) -> None:
    """A peer that accepts connections but never answers (a partition, a hung process)."""
    chunks = chunk_set(NAMESPACE, num_layers=4, seed=8)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; nobody answers
        silent_address = f"127.0.0.1:{silent.getsockname()[1]}"

        async def scenario() -> None:
            tier = _tier(chunks, [silent_address, peers[0].address])
            began = time.monotonic()
            await tier.store(_chunk(chunks, 0), chunks.data(0))
            assert tier.placed_on(chunks.key(0)) == peers[0].address
            assert time.monotonic() - began < 10  # the client's 3 s deadline, then the next peer
            await tier.close()

        asyncio.run(scenario())
