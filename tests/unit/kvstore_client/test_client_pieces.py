"""The client's pure helpers: write splitting and Get-stream reassembly."""

from __future__ import annotations

import pytest

from attnstore.chunks.format import ChunkCorruptError, decode_layout, encode_chunk, verify_layer
from attnstore.errors import OutOfRange
from attnstore.kvstore_client.pieces import (
    DaemonProtocolError,
    LayerAssembler,
    copy_parts,
    header_region,
    join_parts,
    layer_range,
    normalize_put_items,
    split_pieces,
)

NAMESPACE = bytes(range(16))
KV_HEADS, TOKENS, HEAD_DIM = 2, 4, 8
HALF = KV_HEADS * TOKENS * HEAD_DIM * 2  # float16 bytes of K (or V) in one layer


def make_chunk(key_byte: int, num_layers: int = 3) -> bytes:
    layers = [
        (bytes([key_byte + layer]) * HALF, bytes([key_byte + layer + 100]) * HALF)
        for layer in range(num_layers)
    ]
    return encode_chunk(
        namespace=NAMESPACE,
        key=bytes([key_byte]) * 32,
        dtype="float16",
        kv_heads=KV_HEADS,
        tokens=TOKENS,
        head_dim=HEAD_DIM,
        base_position=0,
        layers=layers,
    )


def test_normalize_put_items_accepts_mapping_and_pairs_and_keeps_first_duplicate() -> None:
    assert normalize_put_items({b"a": b"12"}) == [(b"a", memoryview(b"12"))]
    items = normalize_put_items([(b"a", bytearray(b"12")), (b"b", b"3"), (b"a", b"xx")])
    assert [(key, bytes(data)) for key, data in items] == [(b"a", b"12"), (b"b", b"3")]


def test_split_pieces_covers_data_in_bounded_pieces() -> None:
    data = memoryview(bytes(range(250)))
    pieces = list(split_pieces(data, 100))
    assert [(offset, len(piece)) for offset, piece in pieces] == [(0, 100), (100, 100), (200, 50)]
    assert b"".join(bytes(piece) for _, piece in pieces) == bytes(data)
    assert list(split_pieces(memoryview(b""), 100)) == []


def test_layer_range_resolves_zero_end_and_rejects_out_of_range() -> None:
    layouts = [decode_layout(make_chunk(1)), decode_layout(make_chunk(2))]
    assert layer_range(layouts, 0, 0) == (0, 3)
    assert layer_range(layouts, 1, 2) == (1, 2)
    with pytest.raises(OutOfRange):
        layer_range(layouts, 0, 4)
    with pytest.raises(OutOfRange):
        layer_range(layouts, 2, 1)
    with pytest.raises(DaemonProtocolError):
        layer_range([layouts[0], decode_layout(make_chunk(3, num_layers=2))], 0, 0)


def test_header_region_pads_a_bare_header_to_the_data_offset() -> None:
    chunk = make_chunk(1)
    layout = decode_layout(chunk)
    region = chunk[: layout.data_offset]
    assert header_region(region, layout) == region
    bare = chunk[:40]  # preamble and (part of) the msgpack header only
    assert header_region(bare, layout) == bare + bytes(layout.data_offset - 40)
    with pytest.raises(DaemonProtocolError):
        header_region(chunk[: layout.data_offset + 1], layout)


def test_copy_and_join_parts() -> None:
    out = bytearray(5)
    copy_parts([b"ab", memoryview(b"cde")], memoryview(out))
    assert out == b"abcde"
    with pytest.raises(DaemonProtocolError):
        copy_parts([b"ab"], memoryview(bytearray(3)))
    single = b"xyz"
    assert join_parts([single]) is single  # a gRPC slice is handed over without a copy
    assert join_parts([memoryview(b"ab"), b"c"]) == bytearray(b"abc")


def test_check_layer_detects_corruption() -> None:
    chunk = make_chunk(1)
    layout = decode_layout(chunk)
    start, end = layout.layer_span(1, 2)
    verify_layer(layout, 1, chunk[start:end])
    verify_layer(layout, 1, chunk[start : start + 100], chunk[start + 100 : end])  # in parts
    damaged = bytearray(chunk[start:end])
    damaged[0] ^= 1
    with pytest.raises(ChunkCorruptError):
        verify_layer(layout, 1, damaged)


def _slice(chunk: bytes, layer: int) -> bytes:
    start, end = decode_layout(chunk).layer_span(layer, layer + 1)
    return chunk[start:end]


def test_assembler_rebuilds_whole_layers_including_split_ones() -> None:
    chunks = [make_chunk(1), make_chunk(2)]
    layouts = [decode_layout(chunk) for chunk in chunks]
    assembler = LayerAssembler(layouts, 1, 3)
    done = []
    for layer in (1, 2):
        for index, chunk in enumerate(chunks):
            data = _slice(chunk, layer)
            if index == 1:  # a layer sent as two consecutive slices
                assert assembler.add(index, layer, data[:10]) is None
                done.append(assembler.add(index, layer, data[10:]))
            else:
                done.append(assembler.add(index, layer, data))
    assembler.finish()
    assert [(index, layer) for index, layer, _ in done] == [(0, 1), (1, 1), (0, 2), (1, 2)]
    assert [b"".join(parts) for _, _, parts in done] == [
        _slice(chunks[i], layer) for layer in (1, 2) for i in (0, 1)
    ]


def test_assembler_rejects_contract_breaches() -> None:
    chunk = make_chunk(1)
    layouts = [decode_layout(chunk)]
    data = _slice(chunk, 0)
    with pytest.raises(DaemonProtocolError):
        LayerAssembler(layouts, 0, 3).add(1, 0, data)  # unknown chunk index
    with pytest.raises(DaemonProtocolError):
        LayerAssembler(layouts, 1, 3).add(0, 0, data)  # layer outside the request
    assembler = LayerAssembler(layouts, 0, 3)
    assembler.add(0, 0, data)
    with pytest.raises(DaemonProtocolError):
        assembler.add(0, 0, data)  # sent twice
    cut = LayerAssembler(layouts, 0, 3)
    cut.add(0, 0, data[:5])
    with pytest.raises(DaemonProtocolError):
        cut.add(0, 1, _slice(chunk, 1))  # layer 0 cut short
    with pytest.raises(DaemonProtocolError):
        LayerAssembler(layouts, 0, 3).add(0, 0, data + b"x")  # too long
    short = LayerAssembler(layouts, 0, 3)
    short.add(0, 0, data)
    with pytest.raises(DaemonProtocolError):
        short.finish()  # layers 1 and 2 never came
