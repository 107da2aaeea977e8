"""The background half of layer-wise pre-loading: reads the hit prefix's chunks from the
daemon layer-major, assembles each layer across chunks, re-positions keys whose chunk was
computed at another position, and hands the layer to the forward pass (`PrefixKV`).

Any failure ends up in `PrefixKV.fail`, so the forward pass sees PrefixLoadFailed at its
next layer; `classify_failure` tells the engine which fallback to report.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import grpc
import torch

from attnstore.errors import Unavailable
from attnstore.kvstore_client import AsyncKVStoreClient, DaemonProtocolError, LayerPiece
from inference_worker.kv_codec import KVShapeError, layer_views
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
) -> None:
    """Fills `prefix` with the first `head_tokens` tokens of chunk `keys[0]` (all of them,
    or only the attention sinks after truncation), then the other chunks whole, at
    consecutive positions from 0; fails it (never raises) on any error. `tail_tokens`: the
    last chunk is a partial one of that many tokens (0: it is full). `shift` None: a chunk
    stored at another position is an error (no re-positioning)."""
    row: list[LayerPiece] = []  # the current layer's pieces, one per chunk in order
    layer = 0  # the layer being assembled
    try:
        async with contextlib.aclosing(client.iter_layers(namespace, keys)) as pieces:
            async for piece in pieces:
                if piece.chunk_index != len(row) or piece.layer != layer:
                    raise DaemonProtocolError(
                        f"got layer {piece.layer} of chunk {piece.chunk_index} out of layer-major order"
                    )
                last = piece.chunk_index == len(keys) - 1
                _check_piece(piece, prefix.num_layers, tail_tokens if last and tail_tokens else chunk_tokens)
                row.append(piece)
                if len(row) == len(keys):
                    # Per chunk [kv_heads, its tokens, head_dim], views of the pieces' bytes: the
                    # cache joins them with the new tokens in one copy.
                    k_parts, v_parts = layer_views(row)
                    if head_tokens < chunk_tokens:  # chunk 0 gives only its sinks: drop the rest of it
                        k_parts[0], v_parts[0] = k_parts[0][:, :head_tokens], v_parts[0][:, :head_tokens]
                    if device.type != "cpu":
                        k_parts = [part.to(device) for part in k_parts]
                        v_parts = [part.to(device) for part in v_parts]
                    prefix.put_layer(
                        layer, _reposition(k_parts, row, chunk_tokens, head_tokens, shift), v_parts
                    )
                    row, layer = [], layer + 1
        if layer != prefix.num_layers:
            raise DaemonProtocolError(f"the read ended after {layer} of {prefix.num_layers} layers")
    except asyncio.CancelledError:
        prefix.fail(PrefixLoadFailed("prefix load cancelled"))
        raise
    except Exception as exc:  # noqa: BLE001 -- any cache failure means recompute, never a failed turn
        prefix.fail(exc)


def _check_piece(piece: LayerPiece, num_layers: int, tokens: int) -> None:
    header = piece.layout.header
    if header.num_layers != num_layers:
        raise KVShapeError(
            f"chunk {piece.chunk_index} has {header.num_layers} layers, the model {num_layers}"
        )
    if header.tokens != tokens:
        raise KVShapeError(f"chunk {piece.chunk_index} holds {header.tokens} tokens, not {tokens}")


def _reposition(
    k_parts: Sequence[torch.Tensor],
    pieces: Sequence[LayerPiece],
    chunk_tokens: int,
    head_tokens: int,
    shift: RotaryShift | None,
) -> list[torch.Tensor]:
    """Each chunk's keys [kv_heads, its kept tokens, head_dim], rotated (as new tensors) when
    the chunk was stored at a base position other than where its tokens sit now (a no-op
    without truncation). Chunk 0 sits at 0, chunk i >= 1 at head + (i - 1) * C."""
    moved = []
    for index, (k, piece) in enumerate(zip(k_parts, pieces, strict=True)):
        start = 0 if index == 0 else head_tokens + (index - 1) * chunk_tokens
        delta = start - piece.layout.header.base_position
        if delta != 0 and shift is None:
            raise PositionShiftUnsupported(f"chunk {index} must move by {delta} positions")
        moved.append(k if delta == 0 or shift is None else shift.shift_keys(k, delta))
    return moved


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
