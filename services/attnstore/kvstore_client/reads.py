"""The read transports behind one shape, `ChunkRead`: the parsed layouts of the
requested chunks, their header bytes, and their layers in layer-major order.

Shared memory: GetShm leases the chunks, the client parses each header from the arena
and hands out views of each layer; the lease ends when the read closes (lease_releaser.py).
Shared memory without a lease: chunks leased before are copied from where they lay then
(location_cache.py), and the copy counts only if their block versions did not change
meanwhile (`CheckedShmRead.still_valid`).
gRPC: the Get stream's first message carries every header; its slices carry the layers.
Data plane: one request names the chunks; the daemon sends their headers, then their
layers, received straight into the reader's buffers (data_plane.py).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

import grpc

from attnstore.chunks.format import ChunkFormatError, ChunkLayout, decode_layout, header_bytes_needed
from attnstore.errors import ServiceError
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client.arena import ArenaHandle
from attnstore.kvstore_client.data_plane import DataPlane, DataPlaneRead
from attnstore.kvstore_client.lease_releaser import LeaseReleaser
from attnstore.kvstore_client.location_cache import KnownLocation, LocationCache
from attnstore.kvstore_client.pieces import (
    DaemonProtocolError,
    LayerAssembler,
    LayerParts,
    copy_parts,
    header_region,
    layer_range,
)
from attnstore.shm_arena import BlockVersions, Extent, SharedArena

_PREAMBLE_BYTES = 16  # enough for header_bytes_needed to find the header length


class ChunkRead(abc.ABC):
    """An open read of `layouts` (request order), layers [layer_start, layer_end)."""

    layouts: list[ChunkLayout]
    layer_start: int
    layer_end: int

    @abc.abstractmethod
    def header_region(self, index: int) -> bytes:
        """The serialized bytes of chunk `index` before its layer data."""

    @abc.abstractmethod
    def layers(self) -> AsyncIterator[LayerParts]:
        """Every requested layer once, layer-major; the parts are valid only until the
        next item (shared-memory views die with the lease): copy them out."""

    async def copy_into(self, outs: Sequence[memoryview], bases: Sequence[int]) -> None:
        """Copies the requested layers of chunk i into outs[i], whose first byte is byte
        bases[i] of the serialized chunk."""
        async with contextlib.aclosing(self.layers()) as layers:
            async for index, layer, parts in layers:
                start, end = self.layouts[index].layer_span(layer, layer + 1)
                copy_parts(parts, outs[index][start - bases[index] : end - bases[index]])


class _ShmRead(ChunkRead):
    def __init__(
        self,
        arena: SharedArena,
        chunks: Sequence[tuple[int, Sequence[Extent]]],  # (size_bytes, extents) per chunk
        layer_start: int,
        layer_end: int,
    ) -> None:
        self._arena = arena
        self._extents = [extents for _, extents in chunks]
        self.layouts = [_layout_in_arena(arena, extents, size_bytes) for size_bytes, extents in chunks]
        self.layer_start, self.layer_end = layer_range(self.layouts, layer_start, layer_end)

    def header_region(self, index: int) -> bytes:
        return bytes(self._arena.read(self._extents[index], 0, self.layouts[index].data_offset))

    async def copy_into(self, outs: Sequence[memoryview], bases: Sequence[int]) -> None:
        # The layer range of a chunk is contiguous in the chunk: one copy per extent.
        for index, layout in enumerate(self.layouts):
            start, end = layout.layer_span(self.layer_start, self.layer_end)
            self._arena.read_into(
                self._extents[index], start, end, outs[index][start - bases[index] : end - bases[index]]
            )

    async def layers(self) -> AsyncIterator[LayerParts]:
        for layer in range(self.layer_start, self.layer_end):
            for index, layout in enumerate(self.layouts):
                start, end = layout.layer_span(layer, layer + 1)
                yield index, layer, list(self._arena.views(self._extents[index], start, end))


class CheckedShmRead(_ShmRead):
    """A lease-free read of remembered locations. Everything it reads, headers included,
    counts only if `still_valid()` holds after the last copy; any error before that may
    just mean the chunk moved."""

    def __init__(
        self,
        arena: SharedArena,
        versions: BlockVersions,
        known: Sequence[KnownLocation],
        namespace: bytes,
        keys: Sequence[bytes],
        layer_start: int,
        layer_end: int,
    ) -> None:
        self._versions = versions
        self._known = known
        super().__init__(arena, [(k.size_bytes, k.extents) for k in known], layer_start, layer_end)
        for layout, key in zip(self.layouts, keys, strict=True):
            if layout.header.key != key or layout.header.namespace != namespace:
                raise ChunkFormatError("the arena holds another chunk there now")

    def still_valid(self) -> bool:
        """Whether no block of any chunk was freed or deleted since it was leased."""
        return _unchanged(self._versions, self._known)


def _unchanged(versions: BlockVersions, known: Sequence[KnownLocation]) -> bool:
    return all(versions.read(k.blocks) == k.versions for k in known)


def open_checked_read(
    arena: ArenaHandle,
    locations: LocationCache,
    namespace: bytes,
    keys: Sequence[bytes],
    layer_start: int,
    layer_end: int,
) -> CheckedShmRead | None:
    """A lease-free read of `keys` if every one was leased before and none has moved since."""
    mapped, versions = arena.mapped, arena.versions
    if mapped is None or versions is None:
        return None
    known = locations.find(arena.generation, namespace, keys)
    if known is None or not _unchanged(versions, known):  # moved already: skip the copy
        return None
    try:
        return CheckedShmRead(mapped, versions, known, namespace, keys, layer_start, layer_end)
    except (ValueError, ServiceError, DaemonProtocolError):  # perhaps moved: the leased read tells
        return None


def _layout_in_arena(arena: SharedArena, extents: Sequence[Extent], size_bytes: int) -> ChunkLayout:
    """Parses a chunk's header straight from the arena (two small reads)."""
    preamble = arena.read(extents, 0, min(_PREAMBLE_BYTES, size_bytes))
    needed = header_bytes_needed(preamble)
    if needed > size_bytes:
        raise ChunkFormatError(f"chunk header of {needed} bytes exceeds the chunk's {size_bytes} bytes")
    layout = decode_layout(arena.read(extents, 0, needed))
    if layout.total_bytes != size_bytes:
        raise ChunkFormatError(f"chunk header describes {layout.total_bytes} bytes, daemon says {size_bytes}")
    return layout


class _GrpcRead(ChunkRead):
    def __init__(
        self,
        call: grpc.aio.UnaryStreamCall,
        first: kvstore_pb2.GetResponse,
        key_count: int,
        layer_start: int,
        layer_end: int,
    ) -> None:
        if len(first.chunk_headers) != key_count:
            raise DaemonProtocolError(f"Get sent {len(first.chunk_headers)} headers for {key_count} keys")
        self._call = call
        self._first: kvstore_pb2.GetResponse | None = first
        self._headers = list(first.chunk_headers)
        self.layouts = [decode_layout(header) for header in self._headers]
        self.layer_start, self.layer_end = layer_range(self.layouts, layer_start, layer_end)

    def header_region(self, index: int) -> bytes:
        return header_region(self._headers[index], self.layouts[index])

    async def layers(self) -> AsyncIterator[LayerParts]:
        assembler = LayerAssembler(self.layouts, self.layer_start, self.layer_end)
        message, self._first = self._first, None
        while message is not None:
            for piece in message.slices:
                done = assembler.add(piece.chunk_index, piece.layer, piece.data)
                if done is not None:
                    yield done
            received = await self._call.read()
            message = None if received is grpc.aio.EOF else received
        assembler.finish()


@contextlib.asynccontextmanager
async def open_shm_read(
    stub: kvstore_pb2_grpc.KVStoreStub,
    arena: ArenaHandle,
    namespace: bytes,
    keys: Sequence[bytes],
    layer_start: int,
    layer_end: int,
    timeout_seconds: float,
    releaser: LeaseReleaser,
    locations: LocationCache,
) -> AsyncIterator[ChunkRead]:
    """Leases `keys` in the arena for the duration of the `async with` block, and
    remembers where they lie for later lease-free reads."""
    request = kvstore_pb2.GetShmRequest(namespace=namespace, keys=keys, release_lease_ids=releaser.take())
    reply = await stub.GetShm(request, timeout=timeout_seconds)
    try:
        if len(reply.chunks) != len(keys):
            raise DaemonProtocolError(f"GetShm located {len(reply.chunks)} chunks for {len(keys)} keys")
        mapped = await arena.for_generation(reply.arena_generation)
        chunks = [(c.size_bytes, [(e.offset_bytes, e.length_bytes) for e in c.extents]) for c in reply.chunks]
        read = _ShmRead(mapped, chunks, layer_start, layer_end)
        if arena.versions is not None:
            locations.remember(reply.arena_generation, namespace, keys, chunks, arena.versions)
        yield read
    finally:
        releaser.release(reply.lease_id)


@contextlib.asynccontextmanager
async def open_grpc_read(
    stub: kvstore_pb2_grpc.KVStoreStub,
    namespace: bytes,
    keys: Sequence[bytes],
    layer_start: int,
    layer_end: int,
    timeout_seconds: float,
) -> AsyncIterator[ChunkRead]:
    """Streams `keys` over gRPC; leaving the block early cancels the stream."""
    request = kvstore_pb2.GetRequest(
        namespace=namespace, keys=keys, layer_start=layer_start, layer_end=layer_end
    )
    call = stub.Get(request, timeout=timeout_seconds)
    try:
        first = await call.read()
        if first is grpc.aio.EOF:
            raise DaemonProtocolError("Get stream ended before sending the chunk headers")
        yield _GrpcRead(call, first, len(keys), layer_start, layer_end)
    finally:
        call.cancel()  # a no-op once the stream has finished


class _DataPlaneRead(ChunkRead):
    """Chunks streamed by the data plane, layer-major, straight into the reader's buffers
    (`stream` None: the headers of a read the plane completes in one go, `read_data_plane_into`)."""

    def __init__(
        self, headers: list[bytes], stream: DataPlaneRead | None, layer_start: int, layer_end: int
    ) -> None:
        self._headers = headers
        self._stream = stream
        self.layouts = [decode_layout(header) for header in headers]
        self.layer_start, self.layer_end = layer_range(self.layouts, layer_start, layer_end)
        self.complete = False  # every byte the daemon sends has been received

    def header_region(self, index: int) -> bytes:
        return header_region(self._headers[index], self.layouts[index])

    def stream_views(self, outs: Sequence[memoryview], bases: Sequence[int]) -> list[memoryview]:
        """The slices of `outs` the layer-major stream fills, in its order; neighbours in
        one buffer are one slice (a single chunk's layers are one: a receive, not 30)."""
        if len(self.layouts) == 1:  # no walk over the layers (60 us of a 0.5 MB read's Python)
            start, end = self.layouts[0].layer_span(self.layer_start, self.layer_end)
            return [outs[0][start - bases[0] : end - bases[0]]]
        spans: list[list[int]] = []  # [chunk index, first byte, end] in that chunk's buffer
        for layer in range(self.layer_start, self.layer_end):
            for index, layout in enumerate(self.layouts):
                start, end = layout.layer_span(layer, layer + 1)
                start, end = start - bases[index], end - bases[index]
                if spans and spans[-1][0] == index and spans[-1][2] == start:
                    spans[-1][2] = end
                else:
                    spans.append([index, start, end])
        return [outs[index][start:end] for index, start, end in spans]

    async def copy_into(self, outs: Sequence[memoryview], bases: Sequence[int]) -> None:
        assert self._stream is not None
        await self._stream.recv_into(self.stream_views(outs, bases))
        self.complete = True

    async def layers(self) -> AsyncIterator[LayerParts]:
        assert self._stream is not None
        for layer in range(self.layer_start, self.layer_end):
            for index, layout in enumerate(self.layouts):
                start, end = layout.layer_span(layer, layer + 1)
                buffer = bytearray(end - start)
                await self._stream.recv_into([memoryview(buffer)])
                yield index, layer, [buffer]
        self.complete = True


@contextlib.asynccontextmanager
async def open_data_plane_read(
    plane: DataPlane, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int
) -> AsyncIterator[ChunkRead]:
    """Reads `keys` over the data plane (one round trip: the daemon holds the chunks for the
    send, no lease); leaving early discards the connection."""
    stream = await plane.open_read(namespace, keys, layer_start, layer_end)
    read: _DataPlaneRead | None = None
    try:
        read = _DataPlaneRead(stream.headers, stream, layer_start, layer_end)
        yield read
    finally:
        stream.close(complete=read is not None and read.complete)


Outs = list[tuple[memoryview, int]]  # per chunk: its output buffer, the chunk offset of its first byte


async def read_data_plane_into(
    plane: DataPlane, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int,
    outs_for: Callable[[ChunkRead], Outs],
) -> tuple[ChunkRead, Outs]:  # fmt: skip
    """A whole read over the data plane in one trip off the event loop: `outs_for` (called
    there, once the headers are in) picks the buffers. Every hop between the loop and a
    thread waits for a core on a busy node: one trip instead of two took the p50 of a
    0.5 MB Get at one reader from 0.65-0.69 to 0.58-0.63 ms (A/B, 2 rounds, load 9-12 on
    2 cores; throughput moved within the noise)."""
    found: list[tuple[ChunkRead, Outs]] = []
    await plane.read_into(
        namespace, keys, layer_start, layer_end, _placer(layer_start, layer_end, outs_for, found)
    )
    return found[-1]  # a read asked again (data_plane.py) placed twice


def read_data_plane_into_blocking(
    plane: DataPlane, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int,
    outs_for: Callable[[ChunkRead], Outs],
) -> tuple[ChunkRead, Outs]:  # fmt: skip
    """`read_data_plane_into` in the calling thread: no event loop, no thread hop (the
    blocking client's reads)."""
    found: list[tuple[ChunkRead, Outs]] = []
    plane.read_into_blocking(
        namespace, keys, layer_start, layer_end, _placer(layer_start, layer_end, outs_for, found)
    )
    return found[-1]  # a read asked again (data_plane.py) placed twice


def _placer(
    layer_start: int,
    layer_end: int,
    outs_for: Callable[[ChunkRead], Outs],
    found: list[tuple[ChunkRead, Outs]],
) -> Callable[[list[bytes]], list[memoryview]]:
    """The stream's buffers once the headers are in; the read and its outputs go to `found`."""

    def place(headers: list[bytes]) -> list[memoryview]:
        read = _DataPlaneRead(headers, None, layer_start, layer_end)
        outs = outs_for(read)
        found.append((read, outs))
        return read.stream_views([out for out, _ in outs], [base for _, base in outs])

    return place
