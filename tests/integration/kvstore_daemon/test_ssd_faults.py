"""A real daemon on a misbehaving SSD directory: files that fail recovery or verification
(truncated, another format version, empty, garbage, a flipped byte), a disk that runs out
of space (ENOSPC), a disk that turns read-only (EROFS). Every bad chunk is counted in the
metrics, named in the log, answered as a miss and never served; every good chunk still
reads back byte for byte; the daemon keeps serving from DRAM.

Full and read-only disks are real: small tmpfs mounts (root with CAP_SYS_ADMIN; root
ignores file modes, so chmod cannot make a directory read-only for it)."""

from __future__ import annotations

import dataclasses
import errno
import os
import struct
import subprocess
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
import xxhash
from service_probes import is_serving, scrape_metrics
from ssd_chunk_files import verified_chunk_files

from attnstore.chunks.format import FORMAT_VERSION, RESTORE_FORMAT_VERSION, decode_layout
from attnstore.kvstore_client import KVStoreClient, Tier

if TYPE_CHECKING:  # the fixtures' types; conftest modules are not imported by name
    from conftest import ChunkSet, DaemonFactory, DaemonProcess, PollUntil

KiB, MiB = 1024, 1024 * 1024
CORRUPT = "attnstore_kvstore_corrupt_chunks_total"
WRITE_ERRORS = "attnstore_kvstore_ssd_write_errors_total"
SSD_RESERVED = 32 * KiB  # left free for the namespace file on the small disks below
_PREAMBLE = struct.Struct("<4sIQ")  # format.py: magic, header length, xxh3 of the header
# 20 KiB chunks (ChunkSet's defaults) in 64 KiB blocks: a 1 MiB arena holds 16 of them.
SMALL_DRAM = {
    "DRAM_CAPACITY_BYTES": MiB,
    "DRAM_BLOCK_BYTES": 64 * KiB,
    "MAX_CHUNK_BYTES": 64 * KiB,
    "DRAM_HIGH_WATERMARK": 1.0,
    "DRAM_LOW_WATERMARK": 1.0,
    "EVICTION_POLICY": "lru",
}


def chunk_file(ssd_dir: Path, key: bytes) -> Path:
    return ssd_dir / "chunks" / key.hex()[:2] / f"{key.hex()}.chunk"


def another_format_version(data: bytes) -> bytes:
    """The same chunk written by a format version this daemon does not know (the header's
    own checksum recomputed, so only the version is wrong)."""
    layout = decode_layout(data)
    packed = dataclasses.replace(
        layout.header, format_version=max(FORMAT_VERSION, RESTORE_FORMAT_VERSION) + 1
    ).pack()
    assert len(packed) == _PREAMBLE.unpack_from(data)[1]  # same length: the layers stay aligned
    return (
        _PREAMBLE.pack(b"ATKV", len(packed), xxhash.xxh3_64_intdigest(packed))
        + packed
        + data[_PREAMBLE.size + len(packed) :]
    )


def flip_last_byte(path: Path) -> None:
    """A bit rot in the last layer: the header still parses, only a checksum can tell."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def fill_up(disk: Path) -> Path:
    """Takes every byte left on `disk`, as another program filling it would; the file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def temp_files(ssd_dir: Path) -> list[Path]:
    return sorted(ssd_dir.rglob("*.tmp"))


def stored(client: KVStoreClient, chunks: ChunkSet, indices: range) -> list[int]:
    """The indices Lookup reports stored."""
    return [i for i, tier in zip(indices, chunks.tiers(client, indices), strict=True) if tier is not None]


def served(client: KVStoreClient, chunks: ChunkSet, indices: Iterable[int]) -> list[int]:
    """Reads each chunk alone; the indices served (sorted), each with exactly the bytes
    put. The others must be refused as a miss (NOT_FOUND) or a dropped chunk (DATA_LOSS)."""
    found = []
    for index in indices:
        try:
            got = client.get_whole_chunks(chunks.namespace, [chunks.key(index)])
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.DATA_LOSS), (index, exc)
        else:
            assert got == [chunks.data(index)], f"chunk {index} came back different"
            found.append(index)
    return sorted(found)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """`tmpfs(size_bytes)`: a fresh tmpfs of that size, unmounted at teardown."""
    mounts: list[Path] = []

    def mount(size_bytes: int) -> Path:
        point = tmp_path / f"tmpfs{len(mounts)}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"a real full or read-only disk needs a tmpfs mount: {done.stderr.strip()}")
        mounts.append(point)
        return point

    try:
        yield mount
    finally:
        for point in mounts:
            subprocess.run(["umount", "-l", str(point)], check=False)


@dataclasses.dataclass
class DiskDaemon:
    """A daemon with a small DRAM tier whose SSD tier is a tmpfs `disk`; its metrics port;
    the test's chunks."""

    daemon: DaemonProcess
    port: int
    disk: Path
    chunks: ChunkSet

    @contextmanager
    def client(self) -> Iterator[KVStoreClient]:
        """A client with the chunks' namespace registered."""
        with KVStoreClient(self.daemon.address) as client:
            self.chunks.register(client)
            yield client


OnDisk = Callable[[int], DiskDaemon]


@pytest.fixture
def on_disk(daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], tmpfs: Callable[[int], Path]) -> OnDisk:
    """`on_disk(size_bytes)`: a DiskDaemon on a fresh tmpfs of that size."""

    def start(size_bytes: int) -> DiskDaemon:
        disk = tmpfs(size_bytes)
        settings = {"METRICS_PORT": 0, "SSD_RESERVED_BYTES": SSD_RESERVED, **SMALL_DRAM}
        daemon = daemon_factory(ssd_dir=disk, **settings)
        return DiskDaemon(daemon, daemon.metrics_port, disk, chunk_set())

    return start


def free_bytes(disk: Path) -> int:
    stat = os.statvfs(disk)
    return stat.f_bavail * stat.f_frsize


def remount(point: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(point)], check=True)


# ---- files that fail recovery or verification --------------------------------------------------

DAMAGE: dict[str, Callable[[Path, bytes], None]] = {
    "truncated": lambda path, data: path.write_bytes(data[: len(data) // 2]),
    "another format version": lambda path, data: path.write_bytes(another_format_version(data)),
    "empty": lambda path, data: path.write_bytes(b""),
    "garbage": lambda path, data: path.write_bytes(os.urandom(len(data))),
}
READ_DAMAGE = "flipped byte"  # found by recovery (headers only); caught by the first read


def test_bad_chunk_files_are_counted_reported_missed_and_never_served(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet]
) -> None:
    daemon = daemon_factory(METRICS_PORT=0, DRAM_BLOCK_BYTES=64 * KiB)
    port = daemon.metrics_port
    chunks = chunk_set()
    damaged = [*DAMAGE, READ_DAMAGE]
    count = len(damaged) + 2  # two good chunks after the damaged ones
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, count), durable=True)
        assert daemon.stop() == 0
        for index, kind in enumerate(DAMAGE):
            DAMAGE[kind](chunk_file(daemon.ssd_dir, chunks.key(index)), chunks.data(index))
        flip_last_byte(chunk_file(daemon.ssd_dir, chunks.key(len(DAMAGE))))
        daemon.start()

        misses = [None] * len(DAMAGE)
        assert chunks.tiers(client, range(count)) == [*misses, Tier.SSD, Tier.SSD, Tier.SSD]
        assert scrape_metrics(port)[CORRUPT] == len(DAMAGE)  # dropped at recovery
        assert served(client, chunks, range(count)) == [count - 2, count - 1]
        assert chunks.tiers(client, [len(DAMAGE)]) == [None]  # the read found the flipped byte
        assert scrape_metrics(port)[CORRUPT] == len(damaged)
        for index in range(len(damaged)):
            assert not chunk_file(daemon.ssd_dir, chunks.key(index)).exists()
        log = daemon.log_tail(200)
        for reason in ("is not supported", "file is", "shorter than its", "bad magic", "is corrupt"):
            assert reason in log, f"no log line says {reason!r}"
        assert client.stats().ssd.chunks == 2

        # Misses, so a worker recomputes and saves them again: the keys take new bytes.
        assert client.put_chunks(chunks.namespace, chunks.items(0, len(damaged))).stored == chunks.keys(
            0, len(damaged)
        )
        assert served(client, chunks, range(count)) == list(range(count))


# ---- a disk that fills up ----------------------------------------------------------------------
# The tier holds at most what its disk holds less SSD_RESERVED (left for the namespace file):
# a disk smaller than configured, or filled by another program, is pressure (evict), never a
# tier frozen on a write error per chunk (issue 26, point 5).


def capacity(client: KVStoreClient) -> int:
    return int(client.stats().ssd.capacity_bytes)


def test_a_disk_smaller_than_configured_is_clamped_at_start_and_evicts_instead_of_freezing(
    on_disk: OnDisk,
) -> None:
    started = on_disk(512 * KiB)  # the daemon is configured for 256 MiB
    daemon, port, disk, chunks = started.daemon, started.port, started.disk, started.chunks
    ns = chunks.namespace
    with started.client() as client:
        clamped = capacity(client)
        assert 256 * KiB < clamped <= 512 * KiB - SSD_RESERVED
        assert "ssd_capacity_clamped" in daemon.log_tail(200)
        assert scrape_metrics(port)['attnstore_kvstore_capacity_bytes{tier="ssd"}'] == clamped

        for index in range(48):  # 48 chunks of 20 KiB: twice the disk, every one durable
            assert client.put_chunks(ns, chunks.items(index, index + 1), durable=True).stored == [
                chunks.key(index)
            ]
        stats = client.stats()
        assert stats.ssd.evictions > 0 and 0 < stats.ssd.chunks < 48 and stats.ssd.used_bytes <= clamped
        on_disk = verified_chunk_files(disk)
        assert {chunks.key(i) for i in range(48 - len(on_disk), 48)} == set(on_disk)  # the newest
        assert "ssd_write_failed" not in daemon.log_tail(400)
        # A read promotes its chunk and may demote (and so evict) another: compare one at a time.
        for index in reversed(range(48)):
            assert stored(client, chunks, range(index, index + 1)) == served(client, chunks, [index])
        assert temp_files(disk) == []
        assert client.register_namespace(bytes(range(1, 17)), **chunks.layout) > 0
        assert "namespace_not_persisted" not in daemon.log_tail(400)

    assert daemon.stop() == 0
    daemon.start()
    with KVStoreClient(daemon.address) as client:
        assert {chunks.key(i) for i in served(client, chunks, range(48))} == set(verified_chunk_files(disk))
        assert client.lookup(bytes(range(1, 17)), [chunks.key(0)]).prefix_length == 0  # known, empty


def test_a_disk_another_program_fills_is_pressure_and_keeps_room_for_the_namespace_file(
    on_disk: OnDisk, poll_until: PollUntil
) -> None:
    started = on_disk(512 * KiB)
    daemon, disk, chunks = started.daemon, started.disk, started.chunks
    ns = chunks.namespace
    with started.client() as client:
        before = capacity(client)
        client.put_chunks(ns, chunks.items(0, 8), durable=True)
        filler = fill_up(disk)

        for index in range(8, 24):  # the tier shrinks to the disk and evicts its own oldest chunks
            assert client.put_chunks(ns, chunks.items(index, index + 1), durable=True).stored == [
                chunks.key(index)
            ]
        stats = client.stats()
        assert stats.ssd.evictions > 0 and stats.ssd.capacity_bytes < before
        assert "ssd_write_failed" not in daemon.log_tail(400)
        poll_until(lambda: free_bytes(disk) >= SSD_RESERVED, what="the upkeep to evict back to the reserve")
        assert client.register_namespace(bytes(range(1, 17)), **chunks.layout) > 0
        assert "namespace_not_persisted" not in daemon.log_tail(400)
        assert served(client, chunks, range(24)) == stored(client, chunks, range(24))

        filler.unlink()
        # Back to the disk less the reserve (a page or two less than at start: file system overhead).
        poll_until(
            lambda: capacity(client) >= before - 8 * KiB, what="the tier to grow back once the disk is free"
        )

    assert daemon.stop() == 0
    daemon.start()
    with KVStoreClient(daemon.address) as client:
        assert client.lookup(bytes(range(1, 17)), [chunks.key(0)]).prefix_length == 0  # known, empty
        assert {chunks.key(i) for i in served(client, chunks, range(24))} == set(verified_chunk_files(disk))


def test_a_full_disk_keeps_serving_from_dram_and_never_serves_a_partial_chunk(
    on_disk: OnDisk, poll_until: PollUntil
) -> None:
    started = on_disk(160 * KiB)
    daemon, port, disk, chunks = started.daemon, started.port, started.disk, started.chunks
    ns = chunks.namespace
    with started.client() as client:
        filler = fill_up(disk)  # another program takes every byte: nothing of ours to evict
        poll_until(lambda: capacity(client) == 0, what="the tier to see the disk full")
        with pytest.raises(grpc.RpcError) as full:
            client.put_chunks(ns, chunks.items(0, 1), durable=True)
        assert full.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "could not store them durably" in (full.value.details() or "")
        assert "ssd_capacity_clamped" in daemon.log_tail(200)

        # Puts keep succeeding into DRAM; chunks pushed out of DRAM without an SSD copy are lost.
        for index in range(1, 64):
            assert client.put_chunks(ns, chunks.items(index, index + 1)).stored == [chunks.key(index)]
        found = stored(client, chunks, range(64))
        assert served(client, chunks, reversed(range(64))) == found
        assert 0 < len(found) < 64
        assert temp_files(disk) == [] and verified_chunk_files(disk) == {}

        # A new model's namespace still registers (kept in memory while the disk is full).
        assert client.register_namespace(bytes(range(1, 17)), **chunks.layout) > 0
        assert "namespace_not_persisted" in daemon.log_tail(200)
        assert temp_files(disk) == []
        assert is_serving(daemon.address)

        # Space freed: durable writes work again, and upkeep saves the namespace file.
        filler.unlink()
        poll_until(lambda: capacity(client) > 0, what="the tier to see the freed space")
        assert client.put_chunks(ns, chunks.items(64, 65), durable=True).stored == [chunks.key(64)]
        poll_until(lambda: "namespaces_persisted" in daemon.log_tail(200), what="the namespace file saved")
        assert scrape_metrics(port)[WRITE_ERRORS] == 0  # a full disk is seen in its free space, not in errors

    assert daemon.stop() == 0
    daemon.start()  # what the disk holds is all that survives, every byte verified
    with KVStoreClient(daemon.address) as client:
        survivors = served(client, chunks, range(65))
        assert survivors == stored(client, chunks, range(65))
        assert {chunks.key(i) for i in survivors} == set(verified_chunk_files(disk))
        assert 64 in survivors
        assert client.lookup(bytes(range(1, 17)), [chunks.key(0)]).prefix_length == 0  # known, empty


# ---- a disk that turns read-only ---------------------------------------------------------------


def test_a_read_only_disk_serves_what_it_holds_and_refuses_only_durable_writes(on_disk: OnDisk) -> None:
    started = on_disk(4 * MiB)
    daemon, port, disk, chunks = started.daemon, started.port, started.disk, started.chunks
    ns = chunks.namespace
    with started.client() as client:
        client.put_chunks(ns, chunks.items(0, 4), durable=True)
        remount(disk, "ro")
        try:
            assert daemon.stop() == 0
            daemon.start()  # recovery on a read-only disk: everything it holds is served
            assert chunks.tiers(client, range(4)) == [Tier.SSD] * 4
            assert served(client, chunks, range(4)) == [0, 1, 2, 3]

            assert client.put_chunks(ns, chunks.items(4, 5)).stored == [chunks.key(4)]  # into DRAM
            with pytest.raises(grpc.RpcError) as refused:
                client.put_chunks(ns, chunks.items(5, 6), durable=True)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "could not store them durably" in (refused.value.details() or "")
            assert "Read-only file system" in daemon.log_tail(200)
            assert scrape_metrics(port)[WRITE_ERRORS] >= 2
            assert served(client, chunks, range(6)) == list(range(6))
            assert client.register_namespace(bytes(range(1, 17)), **chunks.layout) > 0
            assert client.delete(ns, [chunks.key(0)]) == 1  # the file stays; the index forgets it
            assert chunks.tiers(client, [0]) == [None]
            assert is_serving(daemon.address)
            assert temp_files(disk) == []
        finally:
            remount(disk, "rw")

    assert daemon.stop() == 0
    daemon.start()
    with KVStoreClient(daemon.address) as client:  # the disk never held a byte of chunks 4 and 5
        # Chunk 0's file could not be unlinked: recovery finds it again, intact.
        assert served(client, chunks, range(6)) == [0, 1, 2, 3] == stored(client, chunks, range(6))
