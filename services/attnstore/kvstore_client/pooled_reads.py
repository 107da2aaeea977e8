"""Reading a prefix whose chunks lie in several daemons of the pool (issue 21): the
reader's own daemon holds some, peers hold the ones it placed there (Lookup names each
peer). Each place gets one layer-major read of its chunks, and the reads are merged into
the one layer-major order a layer-wise loader expects: layer l of chunk 0..n-1, then
layer l+1. Layer 0 of every chunk therefore arrives before layer 1 of any, wherever the
chunks lie, so the forward pass overlaps peer fetches exactly as it overlaps local ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence

from attnstore.kvstore_client.pieces import DaemonProtocolError
from attnstore.kvstore_client.results import LayerPiece

LOCAL = ""  # the place of chunks the reader's own daemon holds
# (keys of one place, layer_start, layer_end) -> that place's layer-major pieces
PlaceReader = Callable[[Sequence[bytes], int, int], AsyncIterator[LayerPiece]]


def group_by_place(places: Sequence[str]) -> dict[str, list[int]]:
    """The request indices of the chunks each place holds, in request order."""
    groups: dict[str, list[int]] = {}
    for index, place in enumerate(places):
        groups.setdefault(place, []).append(index)
    return groups


async def merged_layers(
    keys: Sequence[bytes],
    places: Sequence[str],
    reader_of: Callable[[str], PlaceReader],
    layer_start: int,
    layer_end: int,
) -> AsyncIterator[LayerPiece]:
    """The pieces of every place's read in global layer-major order, each renumbered to its
    index in `keys`. `places[i]` holds `keys[i]` (LOCAL or a peer's address)."""
    groups = group_by_place(places)
    position = {index: slot for members in groups.values() for slot, index in enumerate(members)}
    async with contextlib.AsyncExitStack() as stack:
        streams = {
            place: await stack.enter_async_context(
                contextlib.aclosing(reader_of(place)([keys[i] for i in members], layer_start, layer_end))
            )
            for place, members in groups.items()
        }
        while True:
            for index, place in enumerate(places):
                piece = await anext(streams[place], None)
                if piece is None:
                    if index == 0:
                        await _check_all_ended(streams)
                        return
                    raise DaemonProtocolError(f"the read from {place or 'the local daemon'} ended mid-layer")
                if piece.chunk_index != position[index]:
                    raise DaemonProtocolError(
                        f"{place or 'the local daemon'} sent chunks out of layer-major order"
                    )
                yield dataclasses.replace(piece, chunk_index=index)


async def _check_all_ended(streams: dict[str, AsyncIterator[LayerPiece]]) -> None:
    for place, stream in streams.items():
        if await anext(stream, None) is not None:
            raise DaemonProtocolError(f"{place or 'the local daemon'} sent more layers than the others")
