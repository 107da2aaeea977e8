"""The chunk byte format: a checksummed msgpack header, then layer-major K/V.

    offset 0            "ATKV" | header_len u32 | xxh3_64(header) u64     (preamble)
    offset 16           msgpack header
    data_offset         layer 0: K [kv_heads, tokens, head_dim], V (same shape)
    (4096-aligned)      layer 1: K, V
                        ...

Layer-major order lets a reader take layer l of many chunks before layer l+1
exists. Each layer carries its own xxh3_64 checksum, so a reader verifies exactly
the layers it reads.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack
import xxhash

from attnstore.chunks.keys import KEY_BYTES, NAMESPACE_BYTES

FORMAT_VERSION = 1
MAGIC = b"ATKV"
DATA_ALIGN_BYTES = 4096
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_PREAMBLE = struct.Struct("<4sIQ")
_MAX_HEADER_BYTES = 64 * 1024

Buffer = bytes | bytearray | memoryview


class ChunkFormatError(ValueError):
    """The bytes are not a chunk of this format version (bad magic, header or size)."""


class ChunkCorruptError(ValueError):
    """A layer's bytes do not match its checksum."""


def layer_checksum(*parts: Buffer) -> int:
    """xxh3-64 of one layer's bytes, given whole or as consecutive parts."""
    if len(parts) == 1:
        return xxhash.xxh3_64_intdigest(parts[0])
    digest = xxhash.xxh3_64()
    for part in parts:
        digest.update(part)
    return digest.intdigest()


def verify_layer(layout: ChunkLayout, layer: int, *parts: Buffer) -> None:
    """Raises ChunkCorruptError unless `parts` (one whole layer, in order) match its checksum."""
    if layer_checksum(*parts) != layout.header.layer_checksums[layer]:
        raise ChunkCorruptError(f"layer {layer} of chunk {layout.header.key.hex()} is corrupt")


@dataclass(frozen=True)
class ChunkHeader:
    namespace: bytes
    key: bytes
    dtype: str
    num_layers: int
    kv_heads: int
    tokens: int
    head_dim: int
    base_position: int  # position of the first token; keys are stored rotated for it
    layer_checksums: tuple[int, ...]
    format_version: int = FORMAT_VERSION

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer: K and V, each [kv_heads, tokens, head_dim]."""
        return 2 * self.kv_heads * self.tokens * self.head_dim * DTYPE_BYTES[self.dtype]

    def pack(self) -> bytes:
        return msgpack.packb(
            {
                "v": self.format_version,
                "ns": self.namespace,
                "key": self.key,
                "dtype": self.dtype,
                "layers": self.num_layers,
                "kv_heads": self.kv_heads,
                "tokens": self.tokens,
                "head_dim": self.head_dim,
                "base_pos": self.base_position,
                "csum": list(self.layer_checksums),
            }
        )


@dataclass(frozen=True)
class ChunkLayout:
    """A parsed header and where each layer lies in the serialized chunk."""

    header: ChunkHeader
    data_offset: int

    @property
    def total_bytes(self) -> int:
        return self.data_offset + self.header.num_layers * self.header.layer_bytes

    def layer_span(self, layer_start: int, layer_end: int) -> tuple[int, int]:
        """Byte offsets [start, end) of layers [layer_start, layer_end)."""
        size = self.header.layer_bytes
        return self.data_offset + layer_start * size, self.data_offset + layer_end * size


def _data_offset(header_len: int) -> int:
    end = _PREAMBLE.size + header_len
    return -(-end // DATA_ALIGN_BYTES) * DATA_ALIGN_BYTES


def encode_chunk(
    *,
    namespace: bytes,
    key: bytes,
    dtype: str,
    kv_heads: int,
    tokens: int,
    head_dim: int,
    base_position: int,
    layers: Sequence[tuple[Buffer, Buffer]],
) -> bytes:
    """Serializes one chunk from per-layer (K, V) buffers in the model's dtype."""
    header = ChunkHeader(
        namespace=namespace,
        key=key,
        dtype=dtype,
        num_layers=len(layers),
        kv_heads=kv_heads,
        tokens=tokens,
        head_dim=head_dim,
        base_position=base_position,
        layer_checksums=(),
    )
    half = header.layer_bytes // 2
    for index, (k, v) in enumerate(layers):
        if memoryview(k).nbytes != half or memoryview(v).nbytes != half:
            raise ChunkFormatError(f"layer {index}: K and V must each be {half} bytes")
    size = header.layer_bytes
    body = bytearray(len(layers) * size)
    for index, (k, v) in enumerate(layers):
        body[index * size : index * size + half] = memoryview(k).cast("B")
        body[index * size + half : (index + 1) * size] = memoryview(v).cast("B")
    view = memoryview(body)
    checksums = tuple(layer_checksum(view[i * size : (i + 1) * size]) for i in range(len(layers)))
    packed = ChunkHeader(**{**header.__dict__, "layer_checksums": checksums}).pack()
    offset = _data_offset(len(packed))
    out = bytearray(offset)
    _PREAMBLE.pack_into(out, 0, MAGIC, len(packed), xxhash.xxh3_64_intdigest(packed))
    out[_PREAMBLE.size : _PREAMBLE.size + len(packed)] = packed
    out += body
    return bytes(out)


def header_bytes_needed(prefix: Buffer) -> int:
    """How many leading bytes `decode_layout` needs, given at least the 16-byte preamble."""
    if len(prefix) < _PREAMBLE.size:
        raise ChunkFormatError(f"chunk is shorter than its {_PREAMBLE.size}-byte preamble")
    magic, header_len, _ = _PREAMBLE.unpack_from(prefix, 0)
    if magic != MAGIC:
        raise ChunkFormatError("not an attnstore chunk (bad magic)")
    if header_len > _MAX_HEADER_BYTES:
        raise ChunkFormatError(f"header of {header_len} bytes exceeds {_MAX_HEADER_BYTES}")
    return _PREAMBLE.size + header_len


def decode_layout(data: Buffer) -> ChunkLayout:
    """Parses and checks the header at the start of `data` (layer bytes are not read)."""
    needed = header_bytes_needed(data)
    if len(data) < needed:
        raise ChunkFormatError("chunk is shorter than its header")
    _, header_len, header_sum = _PREAMBLE.unpack_from(data, 0)
    packed = bytes(data[_PREAMBLE.size : needed])
    if xxhash.xxh3_64_intdigest(packed) != header_sum:
        raise ChunkFormatError("chunk header checksum mismatch")
    try:
        raw = msgpack.unpackb(packed)
        header = ChunkHeader(
            namespace=raw["ns"],
            key=raw["key"],
            dtype=raw["dtype"],
            num_layers=raw["layers"],
            kv_heads=raw["kv_heads"],
            tokens=raw["tokens"],
            head_dim=raw["head_dim"],
            base_position=raw["base_pos"],
            layer_checksums=tuple(raw["csum"]),
            format_version=raw["v"],
        )
    except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ChunkFormatError(f"malformed chunk header: {exc}") from exc
    if header.format_version != FORMAT_VERSION:
        raise ChunkFormatError(
            f"chunk format version {header.format_version} is not supported (expected {FORMAT_VERSION})"
        )
    if header.dtype not in DTYPE_BYTES:
        raise ChunkFormatError(f"unknown dtype {header.dtype!r}")
    if len(header.namespace) != NAMESPACE_BYTES or len(header.key) != KEY_BYTES:
        raise ChunkFormatError("chunk header has a malformed namespace or key")
    if len(header.layer_checksums) != header.num_layers:
        raise ChunkFormatError("chunk header has a checksum count that differs from its layer count")
    return ChunkLayout(header=header, data_offset=_data_offset(header_len))


def verify_layers(data: Buffer, layout: ChunkLayout, layer_start: int, layer_end: int) -> None:
    """Raises ChunkCorruptError unless layers [layer_start, layer_end) of `data` match
    their checksums; `data` holds the whole serialized chunk."""
    view = memoryview(data)
    for layer in range(layer_start, layer_end):
        start, end = layout.layer_span(layer, layer + 1)
        verify_layer(layout, layer, view[start:end])


def max_chunk_bytes(*, num_layers: int, kv_heads: int, head_dim: int, chunk_tokens: int, dtype: str) -> int:
    """The size of a full chunk of this shape (partial chunks are smaller)."""
    widest = ChunkHeader(
        namespace=bytes(NAMESPACE_BYTES),
        key=bytes(KEY_BYTES),
        dtype=dtype,
        num_layers=num_layers,
        kv_heads=kv_heads,
        tokens=chunk_tokens,
        head_dim=head_dim,
        base_position=2**63 - 1,
        layer_checksums=(2**64 - 1,) * num_layers,
    )
    return _data_offset(len(widest.pack())) + num_layers * widest.layer_bytes
