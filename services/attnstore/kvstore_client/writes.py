"""The two-phase write: ReservePut, the bytes (into the shared-memory arena when mapped,
else over the data plane when the daemon has one, else over one WritePut stream), then
CommitPut. Any failure after reserving aborts the
reservations, so a failed put leaves nothing behind."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from attnstore.errors import FailedPrecondition
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client.arena import ArenaHandle
from attnstore.kvstore_client.data_plane import DataPlane
from attnstore.kvstore_client.pieces import DaemonProtocolError, split_pieces
from attnstore.kvstore_client.results import PutResult

WRITE_PIECE_BYTES = 1024 * 1024  # WritePut payload per message; well under the message limit
_Reserved = Sequence[tuple[memoryview, kvstore_pb2.Reservation]]


async def put_chunks(
    stub: kvstore_pb2_grpc.KVStoreStub,
    arena: ArenaHandle,
    plane: DataPlane | None,
    namespace: bytes,
    items: Sequence[tuple[bytes, memoryview]],
    *,
    durable: bool,
    ttl_seconds: int,
    timeout_seconds: float,
    borrower: str = "",
) -> PutResult:
    """Stores `items` (distinct keys, serialized chunks); see AsyncKVStoreClient.put_chunks."""
    if not items:
        return PutResult(stored=[], already_stored=[], in_progress=[], no_space=[])
    request = kvstore_pb2.ReservePutRequest(
        namespace=namespace,
        items=[kvstore_pb2.PutItem(key=key, size_bytes=data.nbytes) for key, data in items],
        ttl_seconds=ttl_seconds,
        borrower=borrower,
    )
    reply = await stub.ReservePut(request, timeout=timeout_seconds)
    reserved = [
        (data, reservation)
        for (_, data), reservation in zip(items, reply.reservations)
        if reservation.status == kvstore_pb2.RESERVE_STATUS_RESERVED
    ]
    write_ids = [reservation.write_id for _, reservation in reserved]
    try:
        result = _sort_by_status(items, reply.reservations)
        if reserved:
            if await arena.available():
                mapped = await arena.for_generation(reply.arena_generation)
                for data, reservation in reserved:
                    mapped.write([(e.offset_bytes, e.length_bytes) for e in reservation.extents], 0, data)
            elif plane is not None:
                sent = sum(data.nbytes for data, _ in reserved)
                written = await plane.write(namespace, [(r.write_id, data) for data, r in reserved])
                if written != sent:
                    raise DaemonProtocolError(f"the data plane stored {written} of {sent} bytes")
            else:
                await _write_stream(stub, reserved, timeout_seconds)
            commit = kvstore_pb2.CommitPutRequest(write_ids=write_ids, durable=durable)
            committed = (await stub.CommitPut(commit, timeout=timeout_seconds)).committed_count
            if committed != len(write_ids):
                raise FailedPrecondition(f"daemon committed {committed} of {len(write_ids)} chunks")
    except BaseException:
        if write_ids:
            with contextlib.suppress(Exception):  # best effort: reservations also expire
                abort = kvstore_pb2.AbortPutRequest(write_ids=write_ids)
                await stub.AbortPut(abort, timeout=timeout_seconds)
        raise
    return result


def _sort_by_status(
    items: Sequence[tuple[bytes, memoryview]], reservations: Sequence[kvstore_pb2.Reservation]
) -> PutResult:
    if len(reservations) != len(items):
        raise DaemonProtocolError(f"ReservePut answered {len(reservations)} of {len(items)} items")
    result = PutResult(stored=[], already_stored=[], in_progress=[], no_space=[])
    by_status = {
        kvstore_pb2.RESERVE_STATUS_RESERVED: result.stored,
        kvstore_pb2.RESERVE_STATUS_ALREADY_STORED: result.already_stored,
        kvstore_pb2.RESERVE_STATUS_IN_PROGRESS: result.in_progress,
        kvstore_pb2.RESERVE_STATUS_NO_SPACE: result.no_space,
    }
    for (key, _), reservation in zip(items, reservations):
        if reservation.key and reservation.key != key:
            raise DaemonProtocolError("ReservePut answered out of request order")
        if reservation.status not in by_status:
            raise DaemonProtocolError(f"ReservePut returned status {reservation.status}")
        by_status[reservation.status].append(key)
    return result


async def _write_stream(
    stub: kvstore_pb2_grpc.KVStoreStub, reserved: _Reserved, timeout_seconds: float
) -> None:
    """Sends every reserved chunk over one WritePut stream, in pieces of at most 1 MiB."""

    async def requests() -> AsyncIterator[kvstore_pb2.WritePutRequest]:
        for data, reservation in reserved:
            for offset, piece in split_pieces(data, WRITE_PIECE_BYTES):
                # protobuf bytes fields take only `bytes`: one copy per piece
                yield kvstore_pb2.WritePutRequest(
                    write_id=reservation.write_id, offset_bytes=offset, data=bytes(piece)
                )

    reply = await stub.WritePut(requests(), timeout=timeout_seconds)
    sent = sum(data.nbytes for data, _ in reserved)
    if reply.bytes_written != sent:
        raise DaemonProtocolError(f"WritePut stored {reply.bytes_written} of {sent} bytes")
