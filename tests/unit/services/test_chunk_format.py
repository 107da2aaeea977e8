import dataclasses
import os
import struct

import msgpack
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from attnstore.chunks.format import (
    DATA_ALIGN_BYTES,
    RESTORE_FORMAT_VERSION,
    ChunkCorruptError,
    ChunkFormatError,
    ChunkLayout,
    LayerForm,
    decode_layout,
    encode_chunk,
    max_chunk_bytes,
    verify_layers,
)
from attnstore.chunks.keys import NamespaceSpec, chunk_key

NS = NamespaceSpec(model_digest="tiny", dtype="float16", chunk_tokens=8).namespace_id()
KEY = chunk_key(NS, None, list(range(8)))


def make_layers(num_layers: int, kv_heads: int, tokens: int, head_dim: int) -> list[tuple[bytes, bytes]]:
    half = kv_heads * tokens * head_dim * 2
    return [(os.urandom(half), os.urandom(half)) for _ in range(num_layers)]


def encode(layers: list[tuple[bytes, bytes]], tokens: int = 8, base_position: int = 0) -> bytes:
    return encode_chunk(
        namespace=NS,
        key=KEY,
        dtype="float16",
        kv_heads=2,
        tokens=tokens,
        head_dim=4,
        base_position=base_position,
        layers=layers,
    )


@settings(max_examples=30)
@given(st.integers(1, 6), st.integers(1, 8), st.integers(0, 2**40))
def test_round_trip(num_layers: int, tokens: int, base_position: int) -> None:
    layers = make_layers(num_layers, 2, tokens, 4)
    data = encode(layers, tokens, base_position)
    layout = decode_layout(data)
    assert layout.total_bytes == len(data)
    assert layout.data_offset % DATA_ALIGN_BYTES == 0
    assert (layout.header.key, layout.header.namespace, layout.header.tokens) == (KEY, NS, tokens)
    assert layout.header.base_position == base_position
    verify_layers(data, layout, 0, num_layers)
    for index, (k, v) in enumerate(layers):
        start, end = layout.layer_span(index, index + 1)
        assert data[start:end] == k + v  # layer-major: K then V of each layer


def test_a_flipped_byte_in_any_layer_is_detected() -> None:
    data = bytearray(encode(make_layers(3, 2, 8, 4)))
    layout = decode_layout(data)
    start, _ = layout.layer_span(1, 2)
    data[start + 5] ^= 0x01
    verify_layers(data, layout, 0, 1)  # layer 0 is intact
    with pytest.raises(ChunkCorruptError, match="layer 1"):
        verify_layers(data, layout, 0, 3)


def test_a_flipped_byte_in_the_header_is_detected() -> None:
    data = bytearray(encode(make_layers(2, 2, 8, 4)))
    data[20] ^= 0x40
    with pytest.raises(ChunkFormatError, match="checksum"):
        decode_layout(data)


def test_another_format_version_is_refused() -> None:
    data = bytearray(encode(make_layers(1, 2, 8, 4)))
    magic, header_len, _ = struct.unpack_from("<4sIQ", data)
    header = msgpack.unpackb(bytes(data[16 : 16 + header_len]))
    header["v"] = 2
    packed = msgpack.packb(header)
    rebuilt = struct.pack("<4sIQ", magic, len(packed), xxhash.xxh3_64_intdigest(packed)) + packed
    with pytest.raises(ChunkFormatError, match="version 2"):
        decode_layout(rebuilt + bytes(DATA_ALIGN_BYTES))


def test_garbage_is_not_a_chunk() -> None:
    with pytest.raises(ChunkFormatError, match="magic"):
        decode_layout(b"GARBAGE-GARBAGE-GARBAGE")
    with pytest.raises(ChunkFormatError, match="shorter"):
        decode_layout(b"AT")


def test_layers_of_the_wrong_size_are_refused() -> None:
    layers = make_layers(2, 2, 8, 4)
    layers[1] = (layers[1][0][:-2], layers[1][1])
    with pytest.raises(ChunkFormatError, match="layer 1"):
        encode(layers)


def test_max_chunk_bytes_bounds_a_full_chunk() -> None:
    data = encode(make_layers(3, 2, 8, 4))
    assert len(data) <= max_chunk_bytes(num_layers=3, kv_heads=2, head_dim=4, chunk_tokens=8, dtype="float16")
    # SmolLM2-135M in bf16: 30 layers x 3 KV heads x 64 dims x 256 tokens = 5.9 MB of KV.
    smollm = max_chunk_bytes(num_layers=30, kv_heads=3, head_dim=64, chunk_tokens=256, dtype="bfloat16")
    assert smollm == 4096 + 30 * 2 * 3 * 256 * 64 * 2


@pytest.mark.parametrize(
    "forms", [(), (LayerForm.KV, LayerForm.HIDDEN, LayerForm.NONE, LayerForm.KV), (LayerForm.NONE,) * 3]
)
def test_layer_offsets_are_where_layer_span_puts_each_layer(forms: tuple[LayerForm, ...]) -> None:
    layout = decode_layout(encode(make_layers(len(forms) or 5, 2, 8, 4)))
    if forms:  # a restore chunk's mixed layers
        header = dataclasses.replace(
            layout.header, layer_forms=forms, hidden_size=16, format_version=RESTORE_FORMAT_VERSION
        )
        layout = ChunkLayout(header, layout.data_offset)
    layers = layout.header.num_layers
    assert layout.layer_offsets() == [layout.layer_span(i, i)[0] for i in range(layers)] + [
        layout.total_bytes
    ]
