"""Merging the layer-major reads of several places (pooled_reads.py) into one layer-major
order, and refusing places that send too few, too many or misordered layers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from attnstore.chunks.format import decode_layout, encode_chunk
from attnstore.kvstore_client.pieces import DaemonProtocolError
from attnstore.kvstore_client.pooled_reads import LOCAL, PlaceReader, group_by_place, merged_layers
from attnstore.kvstore_client.results import LayerPiece

LAYERS = 3
LAYOUT = decode_layout(
    encode_chunk(
        namespace=bytes(16), key=bytes(32), dtype="float16", kv_heads=1, tokens=1, head_dim=1, base_position=0,
        layers=[(b"kk", b"vv")] * LAYERS,
    )
)  # fmt: skip


def reader(layers: int = LAYERS, swap: bool = False) -> PlaceReader:
    """A place that sends `layers` layers of the keys asked for, layer-major (`swap`: its
    first two chunks in the wrong order)."""

    async def read(keys: Sequence[bytes], start: int, end: int) -> AsyncIterator[LayerPiece]:
        for layer in range(layers):
            order = list(range(len(keys)))
            if swap:
                order[:2] = order[1::-1]
            for index in order:
                yield LayerPiece(
                    chunk_index=index, layer=layer, data=keys[index] + bytes([layer]), layout=LAYOUT
                )

    return read


def collect(places: Sequence[str], readers: dict[str, PlaceReader]) -> list[LayerPiece]:
    keys = [bytes([i]) for i in range(len(places))]

    async def run() -> list[LayerPiece]:
        return [piece async for piece in merged_layers(keys, places, readers.__getitem__, 0, 0)]

    return asyncio.run(run())


def test_pieces_of_every_place_come_in_one_layer_major_order_with_request_indices() -> None:
    places = ["peer-a", LOCAL, "peer-a", "peer-b", LOCAL]
    assert group_by_place(places) == {"peer-a": [0, 2], LOCAL: [1, 4], "peer-b": [3]}
    pieces = collect(places, {LOCAL: reader(), "peer-a": reader(), "peer-b": reader()})
    assert [(p.layer, p.chunk_index) for p in pieces] == [(l, i) for l in range(LAYERS) for i in range(5)]
    assert all(p.data == bytes([p.chunk_index, p.layer]) for p in pieces)  # each chunk's own bytes


@pytest.mark.parametrize(
    ("peer", "message"),
    [
        (reader(layers=LAYERS - 1), "ended mid-layer"),
        (reader(layers=LAYERS + 1), "more layers"),
        (reader(swap=True), "out of layer-major order"),
    ],
    ids=["too-few", "too-many", "misordered"],
)
def test_a_place_that_breaks_the_order_fails_the_read(peer: PlaceReader, message: str) -> None:
    with pytest.raises(DaemonProtocolError, match=message):
        collect([LOCAL, "peer", "peer"], {LOCAL: reader(), "peer": peer})
