"""SsdTier on real files in tmp_path: atomic publish, verification on read, recovery."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest
import xxhash
from faulty_ssd_tier import FaultySsdTier

from attnstore import errors
from attnstore.chunks.format import FORMAT_VERSION, encode_chunk
from attnstore.chunks.keys import NamespaceSpec, chunk_key
from kvstore_daemon.ssd_tier import SsdChunkCorrupt, SsdFullError, SsdTier, SsdWriteError, StoredChunk

NS = NamespaceSpec(model_digest="test-model", dtype="float16", chunk_tokens=4).namespace_id()
KV_HEADS, TOKENS, HEAD_DIM, LAYERS = 2, 4, 8, 3
HALF_BYTES = KV_HEADS * TOKENS * HEAD_DIM * 2  # one K (or V) in float16
CAPACITY = 1 << 30
_PREAMBLE = struct.Struct("<4sIQ")  # format.py's preamble: magic, header_len, xxh3(header)


def make_chunk(index: int, seed: int = 0) -> tuple[bytes, bytes]:
    rng = random.Random(seed * 1_000_003 + index)
    key = chunk_key(NS, None, [index] * TOKENS)
    layers = [(rng.randbytes(HALF_BYTES), rng.randbytes(HALF_BYTES)) for _ in range(LAYERS)]
    data = encode_chunk(
        namespace=NS, key=key, dtype="float16", kv_heads=KV_HEADS, tokens=TOKENS,
        head_dim=HEAD_DIM, base_position=index * TOKENS, layers=layers,
    )  # fmt: skip
    return key, data


def with_format_version(data: bytes, version: int) -> bytes:
    """The same chunk with "v" rewritten in its header and the header checksum recomputed."""
    magic, header_len, _ = _PREAMBLE.unpack_from(data, 0)
    raw = msgpack.unpackb(data[_PREAMBLE.size : _PREAMBLE.size + header_len])
    raw["v"] = version
    packed = msgpack.packb(raw)
    assert len(packed) == header_len  # small ints pack to one byte, so the offsets hold
    out = bytearray(data)
    _PREAMBLE.pack_into(out, 0, magic, len(packed), xxhash.xxh3_64_intdigest(packed))
    out[_PREAMBLE.size : _PREAMBLE.size + len(packed)] = packed
    return bytes(out)


def files(root: Path, pattern: str) -> list[Path]:
    return sorted(root.rglob(pattern))


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0xFF]))


@pytest.fixture
async def tier(tmp_path: Path) -> AsyncIterator[SsdTier]:
    t = SsdTier([tmp_path / "ssd0"], CAPACITY)
    assert await t.open() == []
    yield t
    await t.close()


@pytest.fixture
async def faulty(tmp_path: Path) -> AsyncIterator[FaultySsdTier]:
    t = FaultySsdTier([tmp_path / "ssd0"], CAPACITY)
    await t.open()
    yield t
    await t.close()


async def reopen(dirs: list[Path]) -> tuple[SsdTier, list[StoredChunk]]:
    t = SsdTier(dirs, CAPACITY)
    return t, await t.open()


async def written(dirs: list[Path], *indices: int) -> list[tuple[bytes, bytes, Path]]:
    """Chunks `indices` written by a tier on `dirs`, then closed: each key, data and file."""
    t, _ = await reopen(dirs)
    chunks = [make_chunk(index) for index in indices]
    for key, data in chunks:
        await t.write(key, NS, data)
    stored = [(key, data, t.path_of(key)) for key, data in chunks]
    await t.close()
    return stored


async def test_write_read_round_trip(tier: SsdTier, tmp_path: Path) -> None:
    key, data = make_chunk(1)
    await tier.write(key, NS, memoryview(data))
    assert key in tier and tier.contains(key) and len(tier) == 1
    assert tier.size_of(key) == len(data) == tier.used_bytes
    assert tier.namespace_of(key) == NS
    assert tier.keys() == [key]
    assert tier.path_of(key) == tmp_path / "ssd0" / "chunks" / key.hex()[:2] / f"{key.hex()}.chunk"
    got = await tier.read(key)
    assert isinstance(got, bytearray) and bytes(got) == data
    layout = await tier.read_header(key)
    assert layout.header.key == key and layout.total_bytes == len(data)
    assert files(tmp_path, "*.tmp") == []


async def test_write_of_a_stored_key_is_a_no_op(tier: SsdTier, tmp_path: Path) -> None:
    key, data = make_chunk(1)
    await tier.write(key, NS, data)
    await asyncio.gather(tier.write(key, NS, data), tier.write(key, NS, data))
    assert len(files(tmp_path, "*.chunk")) == 1 and tier.used_bytes == len(data)


async def test_concurrent_writes_of_one_key_publish_once(tier: SsdTier, tmp_path: Path) -> None:
    key, data = make_chunk(1)
    await asyncio.gather(*(tier.write(key, NS, data) for _ in range(4)))
    assert len(files(tmp_path, "*.chunk")) == 1 and tier.used_bytes == len(data)


async def test_write_rejects_bytes_that_do_not_match_the_key(tier: SsdTier) -> None:
    key, _ = make_chunk(1)
    _, other = make_chunk(2)
    with pytest.raises(errors.InvalidArgument):
        await tier.write(key, NS, other)
    with pytest.raises(errors.InvalidArgument):
        await tier.write(key, NS, b"not a chunk at all")
    assert len(tier) == 0


async def test_round_robin_across_two_dirs(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    t = SsdTier(dirs, CAPACITY)
    await t.open()
    chunks = [make_chunk(i) for i in range(6)]
    for key, data in chunks:
        await t.write(key, NS, data)
    assert len(files(dirs[0], "*.chunk")) == 3 and len(files(dirs[1], "*.chunk")) == 3
    for i, (key, data) in enumerate(chunks):
        assert t.path_of(key).is_relative_to(dirs[i % 2])
        assert await t.read(key) == data
    await t.close()


@pytest.mark.parametrize("offset", [-1, 20], ids=["layer-byte", "header-byte"])
async def test_flipped_byte_on_disk_is_dropped_on_read(tier: SsdTier, offset: int) -> None:
    key, data = make_chunk(1)
    other, other_data = make_chunk(2)
    await tier.write(key, NS, data)
    await tier.write(other, NS, other_data)
    path = tier.path_of(key)
    flip_byte(path, offset % len(data))
    with pytest.raises(SsdChunkCorrupt, match=key.hex()) as caught:
        await tier.read(key)
    assert isinstance(caught.value, errors.DataLoss) and caught.value.key == key
    assert tier.corrupt_dropped == 1
    assert key not in tier and not path.exists() and tier.used_bytes == len(other_data)
    with pytest.raises(KeyError):
        await tier.read(key)
    assert await tier.read(other) == other_data  # its neighbour is untouched


async def test_vanished_file_is_dropped_on_read(tier: SsdTier) -> None:
    key, data = make_chunk(1)
    await tier.write(key, NS, data)
    os.unlink(tier.path_of(key))
    with pytest.raises(SsdChunkCorrupt, match="vanished"):
        await tier.read(key)
    assert key not in tier and tier.corrupt_dropped == 1 and tier.used_bytes == 0


async def test_read_of_an_unknown_key_raises_key_error(tier: SsdTier) -> None:
    with pytest.raises(KeyError):
        await tier.read(make_chunk(1)[0])
    with pytest.raises(KeyError):
        await tier.read_header(make_chunk(1)[0])


async def test_delete(tier: SsdTier) -> None:
    key, data = make_chunk(1)
    await tier.write(key, NS, data)
    path = tier.path_of(key)
    assert await tier.delete(key) is True
    assert key not in tier and not path.exists() and tier.used_bytes == 0
    assert await tier.delete(key) is False


async def test_restart_recovers_the_same_chunks(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    t = SsdTier(dirs, CAPACITY)
    await t.open()
    chunks = dict(make_chunk(i) for i in range(5))
    for key, data in chunks.items():
        await t.write(key, NS, data)
    await t.close()

    t2, stored = await reopen(dirs)
    assert sorted(stored, key=lambda s: s.key) == sorted(
        (StoredChunk(k, NS, len(d)) for k, d in chunks.items()), key=lambda s: s.key
    )
    assert t2.recovery_dropped == 0 and t2.used_bytes == sum(map(len, chunks.values()))
    for key, data in chunks.items():
        assert await t2.read(key) == data
    await t2.close()


async def test_a_borrowed_chunk_keeps_its_borrower_across_a_restart(tmp_path: Path) -> None:
    dirs = [tmp_path / "ssd0"]
    t, _ = await reopen(dirs)
    (own, own_data), (lent, lent_data) = make_chunk(1), make_chunk(2)
    await t.write(own, NS, own_data)
    await t.write(lent, NS, lent_data, borrower="node-b/ü")  # any name: it is base64 in the file's name
    await t.close()

    t2, stored = await reopen(dirs)
    assert sorted(stored, key=lambda s: s.key) == sorted(
        [StoredChunk(own, NS, len(own_data)), StoredChunk(lent, NS, len(lent_data), "node-b/ü")],
        key=lambda s: s.key,
    )
    assert await t2.read(lent) == lent_data
    await t2.close()


@pytest.mark.parametrize("mark", ["@", "@!!", "@bm9kZS1i=", "@_w"])  # empty, not base64, padded, not UTF-8
async def test_open_drops_a_chunk_whose_borrower_mark_is_not_canonical(tmp_path: Path, mark: str) -> None:
    dirs = [tmp_path / "ssd0"]
    [(key, _, path)] = await written(dirs, 1)
    marked = path.with_name(f"{key.hex()}{mark}.chunk")
    path.rename(marked)

    t2, stored = await reopen(dirs)
    assert stored == [] and t2.recovery_dropped == 1 and not marked.exists()
    await t2.close()


async def test_open_drops_truncated_files(tmp_path: Path) -> None:
    dirs = [tmp_path / "ssd0"]
    (_, data, path), (kept, _, _) = await written(dirs, 1, 2)
    os.truncate(path, len(data) - 1)

    t2, stored = await reopen(dirs)
    assert [s.key for s in stored] == [kept] and t2.recovery_dropped == 1
    assert not path.exists()
    await t2.close()


async def test_open_removes_leftover_temp_files(tmp_path: Path) -> None:
    dirs = [tmp_path / "ssd0"]
    [(key, data, path)] = await written(dirs, 1)
    leftover = path.parent / f"{key.hex()}.deadbeef.tmp"  # an interrupted write
    leftover.write_bytes(data[:100])

    t2, stored = await reopen(dirs)
    assert [s.key for s in stored] == [key] and t2.recovery_dropped == 0
    assert files(tmp_path, "*.tmp") == []
    await t2.close()


async def test_open_drops_chunks_of_another_format_version(tmp_path: Path) -> None:
    dirs = [tmp_path / "ssd0"]
    [(_, data, path)] = await written(dirs, 1)
    path.write_bytes(with_format_version(data, FORMAT_VERSION + 1))

    t2, stored = await reopen(dirs)
    assert stored == [] and t2.recovery_dropped == 1 and not path.exists()
    await t2.close()


async def test_open_drops_a_chunk_filed_under_another_key(tmp_path: Path) -> None:
    dirs = [tmp_path / "ssd0"]
    [(key, data, _)] = await written(dirs, 1)
    wrong = chunk_key(NS, None, [99] * TOKENS).hex()
    misfiled = tmp_path / "ssd0" / "chunks" / wrong[:2] / f"{wrong}.chunk"
    misfiled.write_bytes(data)

    t2, stored = await reopen(dirs)
    assert [s.key for s in stored] == [key] and t2.recovery_dropped == 1 and not misfiled.exists()
    await t2.close()


async def test_full_tier_refuses_until_the_caller_evicts(tmp_path: Path) -> None:
    (a, a_data), (b, b_data) = make_chunk(1), make_chunk(2)
    t = SsdTier([tmp_path / "ssd0"], capacity_bytes=len(a_data) + len(b_data) - 1)
    await t.open()
    await t.write(a, NS, a_data)
    with pytest.raises(SsdFullError) as caught:
        await t.write(b, NS, b_data)
    assert isinstance(caught.value, errors.ResourceExhausted)
    assert b not in t and files(tmp_path, "*.tmp") == []
    await t.delete(a)
    await t.write(b, NS, b_data)
    assert t.used_bytes == len(b_data)
    await t.close()


async def test_writes_in_flight_count_against_capacity(tmp_path: Path) -> None:
    (a, a_data), (b, b_data) = make_chunk(1), make_chunk(2)
    t = FaultySsdTier([tmp_path / "ssd0"], capacity_bytes=len(a_data) + len(b_data) - 1)
    await t.open()
    t.write_delay_seconds = 0.1
    outcomes = await asyncio.gather(t.write(a, NS, a_data), t.write(b, NS, b_data), return_exceptions=True)
    assert outcomes[0] is None and isinstance(outcomes[1], SsdFullError)
    assert t.keys() == [a] and t.used_bytes == len(a_data)
    await t.close()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["ENOSPC", "EROFS"])
async def test_refused_write_leaves_nothing_behind(faulty: FaultySsdTier, tmp_path: Path, code: int) -> None:
    key, data = make_chunk(1)
    faulty.fail_writes_with = code
    with pytest.raises(SsdWriteError) as caught:
        await faulty.write(key, NS, data)
    assert caught.value.errno == code and key.hex() in str(caught.value)
    assert files(tmp_path, "*.tmp") == [] and files(tmp_path, "*.chunk") == []
    assert key not in faulty and faulty.used_bytes == 0 and faulty.pending_bytes == 0

    faulty.fail_writes_with = None  # the disk recovers: the same write now lands
    await faulty.write(key, NS, data)
    assert await faulty.read(key) == data


async def test_read_only_directory_still_serves_reads(faulty: FaultySsdTier, tmp_path: Path) -> None:
    (old, old_data), (new, new_data) = make_chunk(1), make_chunk(2)
    await faulty.write(old, NS, old_data)
    faulty.fail_writes_with = errno.EROFS  # the filesystem was remounted read-only
    with pytest.raises(SsdWriteError, match=os.strerror(errno.EROFS)):
        await faulty.write(new, NS, new_data)
    assert await faulty.read(old) == old_data
    assert faulty.keys() == [old] and files(tmp_path, "*.tmp") == []


async def test_corrupted_read_is_caught_by_verification(faulty: FaultySsdTier) -> None:
    (a, a_data), (b, b_data) = make_chunk(1), make_chunk(2)
    await faulty.write(a, NS, a_data)
    await faulty.write(b, NS, b_data)
    faulty.corrupt_next_reads = 1
    with pytest.raises(SsdChunkCorrupt, match="corrupt"):
        await faulty.read(a)
    assert faulty.corrupt_next_reads == 0 and faulty.corrupt_dropped == 1 and a not in faulty
    assert await faulty.read(b) == b_data


async def test_slow_read_does_not_block_the_event_loop(faulty: FaultySsdTier) -> None:
    key, data = make_chunk(1)
    await faulty.write(key, NS, data)
    faulty.read_delay_seconds = 0.5
    read = asyncio.create_task(faulty.read(key))
    await asyncio.sleep(0.01)  # the loop gets control back while the read is on an I/O thread
    assert not read.done()
    assert await read == data


async def test_delete_during_write_removes_the_landed_file(faulty: FaultySsdTier, tmp_path: Path) -> None:
    key, data = make_chunk(1)
    faulty.write_delay_seconds = 0.2
    write = asyncio.create_task(faulty.write(key, NS, data))
    await asyncio.sleep(0)  # the write is now on an I/O thread
    assert faulty.pending_bytes == faulty.used_bytes == len(data)  # in-flight bytes count as used
    assert await faulty.delete(key) is True
    assert await faulty.delete(key) is False
    await write
    assert key not in faulty and faulty.used_bytes == 0 and faulty.pending_bytes == 0
    assert files(tmp_path, "*.chunk") == [] and files(tmp_path, "*.tmp") == []

    faulty.write_delay_seconds = 0.0  # a later write of the key publishes again
    await faulty.write(key, NS, data)
    assert await faulty.read(key) == data


async def test_cancelled_writer_still_indexes_the_landed_file(tmp_path: Path) -> None:
    t = FaultySsdTier([tmp_path / "ssd0"], CAPACITY)
    await t.open()
    key, data = make_chunk(1)
    t.write_delay_seconds = 0.2
    write = asyncio.create_task(t.write(key, NS, data))
    await asyncio.sleep(0)
    write.cancel()
    with pytest.raises(asyncio.CancelledError):
        await write
    await t.close()  # waits for in-flight writes
    assert key in t and t.path_of(key).exists() and t.pending_bytes == 0


async def test_closed_tier_refuses_work(tmp_path: Path) -> None:
    t = SsdTier([tmp_path / "ssd0"], CAPACITY)
    key, data = make_chunk(1)
    with pytest.raises(errors.FailedPrecondition):
        await t.write(key, NS, data)  # before open()
    await t.open()
    await t.close()
    with pytest.raises(errors.FailedPrecondition):
        await t.read(key)
