"""Pure helpers of the client: splitting chunk bytes for writes, and checking and
reassembling the layer pieces that a read delivers. No I/O here, so the transports
(shared memory, gRPC stream) share them and tests exercise them without a daemon."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from attnstore.chunks.format import Buffer, ChunkLayout
from attnstore.errors import OutOfRange

PutChunks = Mapping[bytes, Buffer] | Sequence[tuple[bytes, Buffer]]
LayerParts = tuple[int, int, list[Buffer]]  # (chunk index, layer, the layer's bytes in order)


class DaemonProtocolError(Exception):
    """The daemon's reply breaks the kvstore contract (wrong counts, order or sizes)."""


def normalize_put_items(chunks: PutChunks) -> list[tuple[bytes, memoryview]]:
    """(key, flat byte view) per chunk, first occurrence of a key wins: a key reserved
    twice in one call would report its own reservation as IN_PROGRESS."""
    pairs = chunks.items() if isinstance(chunks, Mapping) else chunks
    items: dict[bytes, memoryview] = {}
    for key, data in pairs:
        if key not in items:
            items[bytes(key)] = memoryview(data).cast("B")
    return list(items.items())


def split_pieces(data: memoryview, piece_bytes: int) -> Iterator[tuple[int, memoryview]]:
    """(offset, view) pieces of at most `piece_bytes` covering `data`; none for empty data."""
    for offset in range(0, data.nbytes, piece_bytes):
        yield offset, data[offset : offset + piece_bytes]


def layer_range(layouts: Sequence[ChunkLayout], layer_start: int, layer_end: int) -> tuple[int, int]:
    """The concrete [start, end) of a request (`layer_end` 0 = every layer); all chunks of a
    namespace have the same layer count, so one range serves every chunk."""
    if not layouts:
        return layer_start, layer_end
    num_layers = layouts[0].header.num_layers
    if any(layout.header.num_layers != num_layers for layout in layouts):
        raise DaemonProtocolError("chunks of one namespace have different layer counts")
    end = layer_end or num_layers
    if not 0 <= layer_start <= end <= num_layers:
        raise OutOfRange(f"layers [{layer_start}, {layer_end}) outside the chunks' {num_layers} layers")
    return layer_start, end


def header_region(header: bytes, layout: ChunkLayout) -> bytes:
    """The serialized bytes before the layer data. The daemon may send just the preamble and
    msgpack header; the rest up to the 4096-aligned data offset is the format's zero padding."""
    if len(header) > layout.data_offset:
        raise DaemonProtocolError(f"chunk header of {len(header)} bytes runs past its data offset")
    return header + bytes(layout.data_offset - len(header))


def copy_parts(parts: Sequence[Buffer], out: memoryview) -> None:
    """Copies `parts` back to back into `out`, which they must fill exactly."""
    position = 0
    for part in parts:
        size = memoryview(part).nbytes
        out[position : position + size] = part
        position += size
    if position != out.nbytes:
        raise DaemonProtocolError(f"got {position} bytes for a {out.nbytes}-byte range")


def join_parts(parts: Sequence[Buffer]) -> bytes | bytearray:
    """One owned buffer holding `parts`; a lone `bytes` part is returned as is (no copy)."""
    if len(parts) == 1 and isinstance(parts[0], bytes):
        return parts[0]
    out = bytearray(sum(memoryview(part).nbytes for part in parts))
    copy_parts(parts, memoryview(out))
    return out


class LayerAssembler:
    """Groups the slices of a Get stream into whole layers. A slice normally carries a
    whole layer; a layer larger than one stream message may come as consecutive slices
    of the same (chunk, layer), which are joined here. Each layer must arrive once."""

    def __init__(self, layouts: Sequence[ChunkLayout], layer_start: int, layer_end: int) -> None:
        self._layouts = layouts
        self._start, self._end = layer_start, layer_end
        self._seen: set[tuple[int, int]] = set()
        self._pending: tuple[int, int] | None = None
        self._parts: list[Buffer] = []
        self._pending_bytes = 0

    def add(self, chunk_index: int, layer: int, data: bytes) -> LayerParts | None:
        """Takes one slice; returns the layer once all of its bytes have arrived."""
        if self._pending is not None and self._pending != (chunk_index, layer):
            raise DaemonProtocolError(f"layer {self._pending[1]} of chunk {self._pending[0]} was cut short")
        if not 0 <= chunk_index < len(self._layouts) or not self._start <= layer < self._end:
            raise DaemonProtocolError(f"unexpected slice: chunk {chunk_index}, layer {layer}")
        if (chunk_index, layer) in self._seen:
            raise DaemonProtocolError(f"layer {layer} of chunk {chunk_index} was sent twice")
        size = self._layouts[chunk_index].header.layer_size(layer)
        self._pending = (chunk_index, layer)
        self._parts.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes < size:
            return None
        if self._pending_bytes > size:
            raise DaemonProtocolError(f"layer {layer} of chunk {chunk_index} exceeds its {size} bytes")
        parts = self._parts
        self._seen.add((chunk_index, layer))
        self._pending, self._parts, self._pending_bytes = None, [], 0
        return chunk_index, layer, parts

    def finish(self) -> None:
        """Raises unless every requested layer of every chunk has arrived."""
        expected = len(self._layouts) * (self._end - self._start)
        if self._pending is not None or len(self._seen) != expected:
            raise DaemonProtocolError(f"Get stream ended after {len(self._seen)} of {expected} layers")
