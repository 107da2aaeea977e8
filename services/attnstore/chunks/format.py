"""The chunk byte format: a checksummed msgpack header, then layer-major K/V.

    offset 0            "ATKV" | header_len u32 | xxh3_64(header) u64     (preamble)
    offset 16           msgpack header
    data_offset         layer 0: K [kv_heads, tokens, head_dim], V (same shape)
    (4096-aligned)      layer 1: K, V
                        ...

Layer-major order lets a reader take layer l of many chunks before layer l+1
exists. Each layer carries its own xxh3_64 checksum, so a reader verifies exactly
the layers it reads.

A restore chunk (HCache, format version 2, docs/hidden-states.md) names a form per layer
in its header (`forms`): KV as above, HIDDEN (the layer's input hidden states [tokens,
hidden_size], from which K and V are rebuilt) or NONE (no bytes: the reader recomputes
that layer). Its layers differ in size; `ChunkLayout.layer_span` knows where each lies.
A reader of KV checks `ChunkHeader.is_kv` (version 1 readers reject version 2 outright).
"""

from __future__ import annotations

import functools
import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import msgpack
import xxhash

from attnstore.chunks.keys import KEY_BYTES, NAMESPACE_BYTES

FORMAT_VERSION = 1
RESTORE_FORMAT_VERSION = 2  # per-layer forms (KV, hidden states, none)
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


class LayerForm(IntEnum):
    """What one layer of a chunk holds."""

    KV = 0  # K then V, each [kv_heads, tokens, head_dim]
    HIDDEN = 1  # the layer's input hidden states [tokens, hidden_size]
    NONE = 2  # nothing: the reader recomputes this layer


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
    layer_forms: tuple[LayerForm, ...] = ()  # a restore chunk's form per layer; () = every layer KV
    hidden_size: int = 0  # elements of one token's hidden state (restore chunks only)

    @property
    def is_kv(self) -> bool:
        """Every layer holds K and V (a classic KV chunk)."""
        return not self.layer_forms

    @property
    def layer_bytes(self) -> int:
        """Bytes of one KV layer: K and V, each [kv_heads, tokens, head_dim]."""
        return 2 * self.kv_heads * self.tokens * self.head_dim * DTYPE_BYTES[self.dtype]

    def layer_size(self, layer: int) -> int:
        """Bytes of layer `layer` in this chunk (its form's)."""
        if self.is_kv:
            return self.layer_bytes
        form = self.layer_forms[layer]
        if form is LayerForm.HIDDEN:
            return self.tokens * self.hidden_size * DTYPE_BYTES[self.dtype]
        return self.layer_bytes if form is LayerForm.KV else 0

    def pack(self) -> bytes:
        fields = {
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
        if not self.is_kv:
            fields |= {"forms": [int(form) for form in self.layer_forms], "hidden": self.hidden_size}
        return msgpack.packb(fields)


@dataclass(frozen=True)
class ChunkLayout:
    """A parsed header and where each layer lies in the serialized chunk."""

    header: ChunkHeader
    data_offset: int

    @property
    def total_bytes(self) -> int:
        return self.layer_span(0, self.header.num_layers)[1]

    def layer_span(self, layer_start: int, layer_end: int) -> tuple[int, int]:
        """Byte offsets [start, end) of layers [layer_start, layer_end)."""
        header = self.header
        if header.is_kv:
            size = header.layer_bytes
            return self.data_offset + layer_start * size, self.data_offset + layer_end * size
        return self._offsets[layer_start], self._offsets[layer_end]

    def layer_offsets(self) -> list[int]:
        """Where each layer starts in the serialized chunk, then where the last ends (the
        data plane's C table takes them for every chunk committed to DRAM)."""
        return list(self._offsets)

    @functools.cached_property
    def _offsets(self) -> tuple[int, ...]:
        """layer_offsets, summed once per layout (a restore chunk's layers differ in size)."""
        header = self.header
        layers = range(header.num_layers)
        sizes = [header.layer_bytes] * len(layers) if header.is_kv else [header.layer_size(i) for i in layers]
        return tuple(itertools.accumulate(sizes, initial=self.data_offset))


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
    return encode_layers(header, layers)


def encode_layers(header: ChunkHeader, layers: Sequence[Sequence[Buffer]]) -> bytes:
    """Serializes one chunk described by `header` (its checksums are filled in here) from
    each layer's parts: (K, V) for a KV layer, (hidden,) for a HIDDEN one, () for NONE."""
    if len(layers) != header.num_layers:
        raise ChunkFormatError(f"{len(layers)} layers for a header of {header.num_layers}")
    sizes = [header.layer_size(index) for index in range(header.num_layers)]
    for index, parts in enumerate(layers):
        part_sizes = [memoryview(part).nbytes for part in parts]
        if len(set(part_sizes)) > 1 or sum(part_sizes) != sizes[index]:
            raise ChunkFormatError(
                f"layer {index}: parts of {part_sizes} bytes for a {sizes[index]}-byte layer"
            )
    ends = list(itertools.accumulate(sizes))
    body = bytearray(ends[-1] if ends else 0)
    position = 0
    for parts in layers:
        for part in parts:
            size = memoryview(part).nbytes
            body[position : position + size] = memoryview(part).cast("B")
            position += size
    view = memoryview(body)
    checksums = tuple(layer_checksum(view[end - size : end]) for end, size in zip(ends, sizes, strict=True))
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
            layer_forms=tuple(LayerForm(form) for form in raw.get("forms", ())),
            hidden_size=raw.get("hidden", 0),
        )
    except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ChunkFormatError(f"malformed chunk header: {exc}") from exc
    if header.format_version not in (FORMAT_VERSION, RESTORE_FORMAT_VERSION):
        raise ChunkFormatError(
            f"chunk format version {header.format_version} is not supported "
            f"(expected {FORMAT_VERSION} or {RESTORE_FORMAT_VERSION})"
        )
    restore = header.format_version == RESTORE_FORMAT_VERSION
    if restore != (len(header.layer_forms) == header.num_layers > 0) or restore != (header.hidden_size > 0):
        raise ChunkFormatError("chunk header: per-layer forms and hidden size go with format version 2 only")
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
        layer_forms=(LayerForm.KV,) * num_layers,  # a restore chunk's header is the longer one
        hidden_size=2**63 - 1,
    )
    return _data_offset(len(widest.pack())) + num_layers * widest.layer_bytes
