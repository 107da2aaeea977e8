"""The background half of layer-wise pre-loading: reads the hit prefix's chunks from the
daemon layer-major, assembles each layer across chunks, re-positions keys whose chunk was
computed at another position, and hands the layer to the forward pass (`PrefixKV`).

Any failure ends up in `PrefixKV.fail`, so the forward pass sees PrefixLoadFailed at its
next layer; `classify_failure` tells the engine which fallback to report.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence

import grpc
import torch

from attnstore.errors import Unavailable
from attnstore.kvstore_client import AsyncKVStoreClient, DaemonProtocolError, LayerPiece
from inference_worker.device_copies import CopyStream
from inference_worker.kv_codec import KVShapeError, layer_from_pieces
from inference_worker.layerwise_cache import PrefixKV, PrefixLoadFailed
from inference_worker.rotary_shift import PositionShiftUnsupported, RotaryShift
from inference_worker.turn_types import Fallback

# RESOURCE_EXHAUSTED: DRAM full of leased chunks, for now; the chunks are fine, so keep them.
_UNAVAILABLE_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)
_DEADLINE_CODES = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED})


async def load_prefix(
    client: AsyncKVStoreClient,
    namespace: bytes,
    keys: Sequence[bytes],
    prefix: PrefixKV,
    *,
    chunk_tokens: int,
    head_tokens: int,
    shift: RotaryShift | None,
    device: torch.device,
    tail_tokens: int = 0,
    places: Sequence[str] = (),
    start_position: int = 0,
) -> None:
    """Fills `prefix` with the first `head_tokens` tokens of chunk `keys[0]` (all of them,
    or only the attention sinks after truncation), then the other chunks whole, at
    consecutive positions from `start_position` (the tokens before are in the pool, never
    with truncation); fails it (never raises) on any error. `tail_tokens`: the
    last chunk is a partial one of that many tokens (0: it is full). `shift` None: a chunk
    stored at another position is an error (no re-positioning). `places`: the pool peer
    holding each key ("" = the own daemon; empty: all there), read from directly."""
    row: list[LayerPiece] = []  # the current layer's pieces, one per chunk in order
    layer = 0  # the layer being assembled
    copies = CopyStream(device)
    try:
        async with contextlib.aclosing(client.iter_layers(namespace, keys, places=places)) as pieces:
            async for piece in pieces:
                if piece.chunk_index != len(row) or piece.layer != layer:
                    raise DaemonProtocolError(
                        f"got layer {piece.layer} of chunk {piece.chunk_index} out of layer-major order"
                    )
                last = piece.chunk_index == len(keys) - 1
                _check_piece(piece, prefix.num_layers, tail_tokens if last and tail_tokens else chunk_tokens)
                row.append(piece)
                if len(row) == len(keys):
                    k, v = copies.run(
                        functools.partial(
                            assemble_layer, row, device, chunk_tokens, head_tokens, shift, start_position
                        )
                    )
                    prefix.put_layer(layer, k, v)
                    row, layer = [], layer + 1
        if layer != prefix.num_layers:
            raise DaemonProtocolError(f"the read ended after {layer} of {prefix.num_layers} layers")
    except asyncio.CancelledError:
        prefix.fail(PrefixLoadFailed("prefix load cancelled"))
        raise
    except Exception as exc:  # noqa: BLE001 -- any cache failure means recompute, never a failed turn
        prefix.fail(exc)


def assemble_layer(
    row: Sequence[LayerPiece],
    device: torch.device,
    chunk_tokens: int,
    head_tokens: int,
    shift: RotaryShift | None,
    start_position: int,
    restore_chunks: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [kv_heads, prefix tokens, head_dim] of one layer from its pieces `row`:
    checksums verified on the copies, chunk 0's head kept, keys re-positioned.
    `restore_chunks`: the pieces are KV layers of restore chunks (restore/loader.py)."""
    pieces = layer_from_pieces(row, device=device, verify=True, restore_chunks=restore_chunks)
    k, v = keep_head(*pieces, head_tokens, chunk_tokens)
    return reposition_keys(k, row, chunk_tokens, head_tokens, shift, start_position), v


def _check_piece(piece: LayerPiece, num_layers: int, tokens: int) -> None:
    header = piece.layout.header
    if header.num_layers != num_layers:
        raise KVShapeError(
            f"chunk {piece.chunk_index} has {header.num_layers} layers, the model {num_layers}"
        )
    if header.tokens != tokens:
        raise KVShapeError(f"chunk {piece.chunk_index} holds {header.tokens} tokens, not {tokens}")


def keep_head(
    k: torch.Tensor, v: torch.Tensor, head_tokens: int, chunk_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V [kv_heads, tokens, head_dim] of chunks laid end to end, with only the first
    `head_tokens` tokens of chunk 0 (its attention sinks after a truncation)."""
    if head_tokens >= chunk_tokens:
        return k, v
    return (
        torch.cat((k[:, :head_tokens], k[:, chunk_tokens:]), dim=1),
        torch.cat((v[:, :head_tokens], v[:, chunk_tokens:]), dim=1),
    )


def reposition_keys(
    k: torch.Tensor,
    pieces: Sequence[LayerPiece],
    chunk_tokens: int,
    head_tokens: int,
    shift: RotaryShift | None,
    start_position: int,
) -> torch.Tensor:
    """Rotates, in place, the keys [kv_heads, prefix_tokens, head_dim] of each chunk stored
    at a base position other than where its tokens sit now (a no-op without truncation).
    Chunk 0 sits at 0 (its first `head_tokens` tokens), chunk i >= 1 at head + (i - 1) * C,
    all `start_position` further."""
    for index, piece in enumerate(pieces):
        start = 0 if index == 0 else head_tokens + (index - 1) * chunk_tokens
        delta = start_position + start - piece.layout.header.base_position
        if delta == 0:
            continue
        if shift is None:
            raise PositionShiftUnsupported(f"chunk {index} must move by {delta} positions")
        tokens = piece.layout.header.tokens  # chunk_tokens but for a partial last chunk
        span = slice(start, start + (min(head_tokens, tokens) if index == 0 else tokens))
        k[:, span, :] = shift.shift_keys(k[:, span, :], delta)  # [kv_heads, span tokens, head_dim]
    return k


def classify_failure(exc: BaseException) -> Fallback:
    """The fallback a failed prefix load (or lookup) reports. A PrefixLoadFailed without a
    cause is a layer that missed its deadline."""
    cause = exc.__cause__ if isinstance(exc, PrefixLoadFailed) else exc
    if cause is None or isinstance(cause, TimeoutError):
        return Fallback.DEADLINE
    if isinstance(cause, grpc.aio.AioRpcError):
        if cause.code() in _DEADLINE_CODES:
            return Fallback.DEADLINE
        if cause.code() in _UNAVAILABLE_CODES:
            return Fallback.DAEMON_UNAVAILABLE
        return Fallback.CHUNK_INVALID  # NOT_FOUND (evicted meanwhile), DATA_LOSS, ...
    if isinstance(cause, OSError | Unavailable):  # the arena or the connection went away
        return Fallback.DAEMON_UNAVAILABLE
    # Corrupt, malformed or misshapen chunks; chunks that cannot be re-positioned.
    return Fallback.CHUNK_INVALID
