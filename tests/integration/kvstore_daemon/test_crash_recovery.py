"""Crashes and restarts of a real daemon: what a durable commit promises, what an
uncommitted write leaves behind, what a corrupt file on SSD turns into, how SIGTERM ends."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from attnstore.chunks.format import decode_layout
from attnstore.kvstore.v1 import kvstore_pb2 as pb
from attnstore.kvstore_client import KVStoreClient, Tier

if TYPE_CHECKING:  # the fixtures' types; conftest modules are not imported by name
    from collections.abc import Callable

    from conftest import ChunkSet, DaemonFactory, DaemonProcess, PollUntil

    from attnstore.kvstore.v1.kvstore_pb2_grpc import KVStoreStub


def arena_files(daemon: DaemonProcess) -> list[Path]:
    return sorted(daemon.shm_dir.glob("attnstore-arena-*.bin"))


def temp_files(daemon: DaemonProcess) -> list[Path]:
    return sorted(daemon.ssd_dir.rglob("*.tmp"))


def chunk_file(daemon: DaemonProcess, key: bytes) -> Path:
    return daemon.ssd_dir / "chunks" / key.hex()[:2] / f"{key.hex()}.chunk"


def reachable(client: KVStoreClient) -> bool:
    try:
        client.stats()
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return False
    return True


def layer_offset(data: bytes, layer: int) -> int:
    start, _ = decode_layout(data).layer_span(layer, layer + 1)
    return start


def flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


class DurableWriter(threading.Thread):
    """Puts chunk after chunk with durable=True until a put fails (the daemon died)."""

    def __init__(self, address: str, chunks: ChunkSet, count: int, use_shm: bool) -> None:
        super().__init__(name="durable-writer", daemon=True)
        self._client = KVStoreClient(address, use_shm=use_shm, timeout_seconds=5.0)
        self._chunks = chunks
        self._count = count
        self.acknowledged: list[int] = []  # indices whose durable put returned success
        self.attempted: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for index in range(self._count):
                self.attempted.append(index)
                result = self._client.put_chunks(
                    self._chunks.namespace, self._chunks.items(index, index + 1), durable=True
                )
                assert result.stored == [self._chunks.key(index)]
                self.acknowledged.append(index)
        except (grpc.RpcError, AssertionError) as exc:  # UNAVAILABLE once the daemon is killed
            self.error = exc
        finally:
            self._client.close()


@pytest.mark.parametrize("use_shm", [True, False], ids=["shm", "grpc"])
def test_kill9_during_durable_writes_keeps_every_acknowledged_chunk(
    daemon: DaemonProcess, chunk_set: type[ChunkSet], poll_until: PollUntil, use_shm: bool
) -> None:
    chunks = chunk_set(num_layers=8, head_dim=64)
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        writer = DurableWriter(daemon.address, chunks, count=10_000, use_shm=use_shm)
        writer.start()
        poll_until(lambda: len(writer.acknowledged) >= 20, what="20 acknowledged durable puts")
        daemon.kill9()
        writer.join(timeout=30)
        assert not writer.is_alive()
        assert isinstance(writer.error, grpc.RpcError), writer.error
        assert writer.error.code() == grpc.StatusCode.UNAVAILABLE
        assert len(arena_files(daemon)) == 1  # a crash cannot clean up after itself

        daemon.start()  # same port and directories, no RegisterNamespace needed again
        # The writer's failed calls put the (shared) subchannel in reconnect backoff.
        poll_until(lambda: reachable(client), what="the client to reconnect")
        assert len(arena_files(daemon)) == 1, "the dead daemon's arena must be removed at start"
        assert temp_files(daemon) == []
        acknowledged = writer.acknowledged
        lookup = client.lookup(chunks.namespace, chunks.keys(0, len(acknowledged)))
        assert lookup.prefix_length == len(acknowledged)
        assert set(lookup.tiers) == {Tier.SSD}
        for start in range(0, len(acknowledged), 8):
            indices = acknowledged[start : start + 8]
            got = client.get_whole_chunks(chunks.namespace, [chunks.key(index) for index in indices])
            assert got == [chunks.data(index) for index in indices]
        # The put in flight at the kill may have landed or not, but never half.
        in_flight = [index for index in writer.attempted if index not in acknowledged]
        landed = [index for index in in_flight if chunks.tiers(client, [index]) != [None]]
        for index in landed:
            assert client.get_whole_chunks(chunks.namespace, [chunks.key(index)]) == [chunks.data(index)]
        stats = client.stats()
        assert stats.ssd.chunks == len(acknowledged) + len(landed) and stats.reservations == 0
        poll_until(lambda: client.stats().leases == 0, what="the client to release its read leases")


def test_a_reservation_that_never_committed_leaves_nothing_after_a_crash(
    daemon: DaemonProcess,
    chunk_set: type[ChunkSet],
    raw_stub: Callable[[DaemonProcess], KVStoreStub],
) -> None:
    chunks = chunk_set()
    stub = raw_stub(daemon)
    stub.RegisterNamespace(
        pb.RegisterNamespaceRequest(namespace=chunks.namespace, layout=pb.NamespaceLayout(**chunks.layout))
    )
    committed, written = chunks.key(0), chunks.key(1)
    with KVStoreClient(daemon.address) as client:
        client.put_chunks(chunks.namespace, chunks.items(0, 1), durable=True)
        data = chunks.data(1)
        reply = stub.ReservePut(
            pb.ReservePutRequest(
                namespace=chunks.namespace, items=[pb.PutItem(key=written, size_bytes=len(data))]
            )
        )
        [reservation] = reply.reservations
        assert reservation.status == pb.RESERVE_STATUS_RESERVED
        half = pb.WritePutRequest(write_id=reservation.write_id, offset_bytes=0, data=data[: len(data) // 2])
        assert stub.WritePut(iter([half])).bytes_written == len(data) // 2
        assert client.lookup(chunks.namespace, [written]).prefix_length == 0  # invisible before commit
        assert client.stats().reservations == 1

        daemon.kill9()
        # A write to SSD interrupted by the crash leaves a temp file (as _publish names it).
        interrupted = daemon.ssd_dir / "chunks" / written.hex()[:2] / f"{written.hex()}.0123456789abcdef.tmp"
        interrupted.write_bytes(data[: len(data) // 2])
        daemon.start()
        assert client.lookup(chunks.namespace, [committed, written]).prefix_length == 1
        with pytest.raises(grpc.RpcError) as failed:
            client.get_whole_chunks(chunks.namespace, [written])
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        commit = pb.CommitPutRequest(write_ids=[reservation.write_id])
        with pytest.raises(grpc.RpcError) as failed:
            stub.CommitPut(commit)  # the reservation died with the daemon
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        stats = client.stats()
        assert stats.reservations == 0 and stats.ssd.chunks == 1
        assert temp_files(daemon) == [] and not chunk_file(daemon, written).exists()
        # The key is free again: a new writer stores it whole.
        assert client.put_chunks(chunks.namespace, chunks.items(1, 2)).stored == [written]
        assert client.get_whole_chunks(chunks.namespace, [written]) == [data]


def test_a_corrupt_chunk_file_fails_cleanly_and_disappears(
    daemon_factory: DaemonFactory,
    chunk_set: type[ChunkSet],
    raw_stub: Callable[[DaemonProcess], KVStoreStub],
) -> None:
    block_bytes = 64 * 1024
    daemon = daemon_factory(DRAM_BLOCK_BYTES=block_bytes)
    chunks = chunk_set()  # 20 KiB chunks: one arena block each
    ns = chunks.namespace
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(ns, chunks.items(0, 5), durable=True)
        assert daemon.stop() == 0
        # Chunk 0 gets a flipped byte in layer 2 (only that layer's checksum can tell),
        # chunk 1 in its header (recovery drops it), chunk 2 in the last byte of its last layer.
        for index, offset in (
            (0, layer_offset(chunks.data(0), 2) + 100),
            (1, 20),
            (2, len(chunks.data(2)) - 1),
        ):
            flip_byte(chunk_file(daemon, chunks.key(index)), offset)
        daemon.start()

        assert chunks.tiers(client, range(5)) == [Tier.SSD, None, Tier.SSD, Tier.SSD, Tier.SSD]
        before = client.stats()
        assert before.ssd.chunks == 4 and before.dram.used_bytes == 0
        stub = raw_stub(daemon)
        get = pb.GetRequest(namespace=ns, keys=[chunks.key(0)])
        get_shm = pb.GetShmRequest(namespace=ns, keys=[chunks.key(3), chunks.key(2)])
        for call in (lambda: list(stub.Get(get)), lambda: stub.GetShm(get_shm)):
            with pytest.raises(grpc.RpcError) as failed:
                call()  # never the corrupted bytes: the daemon verifies every layer first
            assert failed.value.code() in (grpc.StatusCode.DATA_LOSS, grpc.StatusCode.NOT_FOUND)
            assert "chunk" in (failed.value.details() or "")

        # The corrupt chunks are gone (file and all); GetShm's good chunk 3 was promoted.
        assert chunks.tiers(client, range(5)) == [None, None, None, Tier.DRAM, Tier.SSD]
        assert not chunk_file(daemon, chunks.key(0)).exists()
        assert not chunk_file(daemon, chunks.key(2)).exists()
        after = client.stats()
        assert after.ssd.chunks == before.ssd.chunks - 2
        assert after.dram.chunks == 1 and after.dram.used_bytes == block_bytes  # failed copies freed theirs
        assert after.reservations == after.leases == after.pinned_chunks == 0
        assert after.namespaces == before.namespaces
        assert client.get_whole_chunks(ns, chunks.keys(3, 5)) == [chunks.data(3), chunks.data(4)]


def test_an_unreadable_chunk_file_fails_the_read_and_frees_its_blocks(
    daemon_factory: DaemonFactory, chunk_set: type[ChunkSet], raw_stub: Callable[[DaemonProcess], KVStoreStub]
) -> None:
    """A read error that says nothing about the bytes (EIO, EISDIR...) keeps the chunk but
    must not keep the DRAM blocks its failed promotion allocated."""
    block_bytes = 64 * 1024
    daemon = daemon_factory(DRAM_BLOCK_BYTES=block_bytes)
    chunks = chunk_set()
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 2), durable=True)
        daemon.restart()  # both chunks now live on SSD only
        path = chunk_file(daemon, chunks.key(0))
        path.unlink()
        path.mkdir()  # open() still works, read() fails with EISDIR: an I/O error, not corruption
        stub = raw_stub(daemon)
        with pytest.raises(grpc.RpcError) as failed:
            list(stub.Get(pb.GetRequest(namespace=chunks.namespace, keys=[chunks.key(0)])))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE  # retryable: the chunk is kept
        assert "Is a directory" in (failed.value.details() or "")
        assert chunks.tiers(client, [0, 1]) == [Tier.SSD, Tier.SSD]
        stats = client.stats()
        assert stats.dram.chunks == 0 and stats.leases == 0
        assert stats.dram.used_bytes == 0, "the failed promotion leaked its DRAM blocks"
        assert client.get_whole_chunks(chunks.namespace, [chunks.key(1)]) == [chunks.data(1)]


def test_ids_from_before_a_crash_name_nothing_after_it(
    daemon: DaemonProcess, chunk_set: type[ChunkSet], raw_stub: Callable[[DaemonProcess], KVStoreStub]
) -> None:
    """A client that outlives the daemon still holds its write ids and lease ids (the SDK
    aborts and releases them on its error paths); they must not touch another client's."""
    chunks = chunk_set()
    ns, stub = chunks.namespace, raw_stub(daemon)
    stub.RegisterNamespace(
        pb.RegisterNamespaceRequest(namespace=ns, layout=pb.NamespaceLayout(**chunks.layout))
    )

    def reserve(index: int) -> int:
        item = pb.PutItem(key=chunks.key(index), size_bytes=len(chunks.data(index)))
        [reservation] = stub.ReservePut(pb.ReservePutRequest(namespace=ns, items=[item])).reservations
        return reservation.write_id

    def lease(index: int) -> int:
        return stub.GetShm(pb.GetShmRequest(namespace=ns, keys=[chunks.key(index)])).lease_id

    first = reserve(0)
    stub.WritePut(iter([pb.WritePutRequest(write_id=first, offset_bytes=0, data=chunks.data(0))]))
    stub.CommitPut(pb.CommitPutRequest(write_ids=[first], durable=True))
    old_lease, old_write = lease(0), reserve(1)  # the old client's, lost in the crash
    daemon.kill9()
    daemon.start()

    reserve(2)
    new_lease, new_write = lease(0), reserve(3)  # another client's, in the new life
    released = stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_ids=[old_lease])).released_count
    aborted = stub.AbortPut(pb.AbortPutRequest(write_ids=[old_write])).aborted_count
    assert (released, aborted) == (0, 0), f"stale ids {old_lease}/{old_write} hit {new_lease}/{new_write}"
    stats = stub.Stats(pb.StatsRequest())
    assert stats.leases == 1 and stats.reservations == 2


def test_a_client_reaches_a_restarted_daemon_soon_after_it_returns(
    daemon: DaemonProcess, poll_until: PollUntil
) -> None:
    """While the daemon is down every call fails and gRPC backs off between reconnects
    (by default 1, 1.6, 2.6, 4.2, 6.7 s... up to 120 s, failing calls fast in between);
    capped at 1 s, a client whose daemon was gone for 10 s reaches it again within ~1 s."""
    with KVStoreClient(daemon.address, use_shm=False) as client:
        client.stats()
        daemon.kill9()
        down_until = time.monotonic() + 10.0
        while time.monotonic() < down_until:
            with pytest.raises(grpc.RpcError) as error:
                client.stats()
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE
            time.sleep(0.2)
        daemon.start()
        back = time.monotonic()

        def reachable() -> bool:
            try:
                client.stats()
            except grpc.RpcError:
                return False
            return True

        poll_until(reachable, what="the client to reach the restarted daemon", timeout_seconds=30.0)
        assert time.monotonic() - back < 2.5


def test_sigterm_exits_zero_removes_the_arena_and_keeps_every_chunk(
    daemon: DaemonProcess, chunk_set: type[ChunkSet]
) -> None:
    chunks = chunk_set()
    with KVStoreClient(daemon.address) as client:
        chunks.register(client)
        client.put_chunks(chunks.namespace, chunks.items(0, 8))  # not durable: written to SSD behind
        assert len(arena_files(daemon)) == 1
        assert daemon.stop() == 0
        assert arena_files(daemon) == []
        assert temp_files(daemon) == []
        daemon.start()  # a graceful stop lets the background SSD writes finish first
        assert client.get_whole_chunks(chunks.namespace, chunks.keys(0, 8)) == [
            chunks.data(i) for i in range(8)
        ]
