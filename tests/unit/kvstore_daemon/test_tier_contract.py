"""The `Tier` contract, held by every tier the mover moves chunks through: DRAM (a real
shared-memory arena), SSD (real files) and the tests' fault-injecting SSD. Each takes a
copy when it has room, gives the same bytes back, accounts for them, and forgets them on
discard; the fault-injecting one refuses a write the way a full disk does."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from faulty_ssd_tier import FaultySsdTier

from attnstore.chunks.format import encode_chunk
from attnstore.chunks.keys import NamespaceSpec, chunk_key
from kvstore_daemon.chunk_entry import Chunk, TierName
from kvstore_daemon.dram_tier import DramTier
from kvstore_daemon.ssd_tier import SsdTier
from kvstore_daemon.tier import Tier, TierCopyCorrupt, TierFull, TierWriteError

NS = NamespaceSpec(model_digest="contract", dtype="float16", chunk_tokens=4).namespace_id()
BLOCK = 8192  # one chunk below fits one block


def chunk(index: int) -> tuple[Chunk, bytes]:
    key = chunk_key(NS, None, [index] * 4)
    data = encode_chunk(
        namespace=NS, key=key, dtype="float16", kv_heads=2, tokens=4, head_dim=8, base_position=0,
        layers=[(bytes([index]) * 128, bytes([index + 1]) * 128)] * 3,
    )  # fmt: skip
    return Chunk(key, NS, len(data)), data


TWO_CHUNKS = 2 * chunk(0)[0].size_bytes


async def dram(tmp_path: Path) -> DramTier:
    return DramTier(tmp_path, 2 * BLOCK, BLOCK)


async def ssd(tmp_path: Path) -> SsdTier:
    tier = SsdTier([tmp_path / "ssd"], TWO_CHUNKS)
    await tier.open()
    return tier


async def faulty_ssd(tmp_path: Path) -> FaultySsdTier:
    tier = FaultySsdTier([tmp_path / "ssd"], TWO_CHUNKS)
    await tier.open()
    return tier


MAKERS: dict[str, Callable[[Path], Awaitable[Tier]]] = {"dram": dram, "ssd": ssd, "faulty_ssd": faulty_ssd}


@pytest.fixture(params=list(MAKERS))
async def tier(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Tier]:
    """Room for exactly two chunks."""
    made = await MAKERS[request.param](tmp_path)
    yield made
    if isinstance(made, DramTier):
        made.close()
    else:
        await made.close()


async def test_store_load_discard_and_the_accounting(tier: Tier) -> None:
    (a, a_data), (b, b_data), (c, c_data) = chunk(1), chunk(2), chunk(3)
    assert tier.name in (TierName.DRAM, TierName.SSD)
    assert tier.used_bytes == 0 and tier.has_room(a.size_bytes)
    await tier.store(a, a_data)
    await tier.store(b, b_data)
    assert bytes(await tier.load(a)) == a_data and bytes(await tier.load(b)) == b_data
    assert 0 < tier.used_bytes <= tier.capacity_bytes
    assert not tier.has_room(c.size_bytes)
    tier.recheck_room()  # the disk (or arena) still holds what it held
    assert not tier.has_room(c.size_bytes)

    unlinking = tier.discard(a)
    if unlinking is not None:
        await unlinking
    assert tier.has_room(c.size_bytes)
    with pytest.raises((KeyError, TierCopyCorrupt)):
        await tier.load(a)
    await tier.store(c, c_data)
    assert bytes(await tier.load(c)) == c_data


async def test_a_copy_without_room_is_refused_and_nothing_is_stored(tier: Tier) -> None:
    (a, a_data), (b, b_data), (c, c_data) = chunk(1), chunk(2), chunk(3)
    await tier.store(a, a_data)
    await tier.store(b, b_data)
    used = tier.used_bytes
    with pytest.raises(TierFull):
        await tier.store(c, c_data)
    assert tier.used_bytes == used


async def test_the_fault_injecting_twin_refuses_like_a_full_disk(tmp_path: Path) -> None:
    tier = await faulty_ssd(tmp_path)
    (a, a_data) = chunk(1)
    tier.fail_writes_with = errno.ENOSPC
    with pytest.raises(TierWriteError) as refused:
        await tier.store(a, a_data)
    assert refused.value.errno == errno.ENOSPC and tier.used_bytes == 0
    tier.fail_writes_with = None
    await tier.store(a, a_data)
    assert bytes(await tier.load(a)) == a_data
    await tier.close()
