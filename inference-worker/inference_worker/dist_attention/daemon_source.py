"""A segment's KV from this node's KV-store daemon: chunks the pool placed here, read once
(layers checked against their checksums) into [layers, tokens, kv_heads, head_dim]."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import torch

from attnstore.chunks.format import ChunkCorruptError
from attnstore.errors import (
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ServiceError,
    Unavailable,
)
from attnstore.kvstore_client import AsyncKVStoreClient, LayerPiece
from inference_worker.kv_codec import KVShapeError, layer_from_pieces

_DAEMON_REFUSALS: dict[grpc.StatusCode, type[ServiceError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
}


async def read_chunks(
    kvstore: AsyncKVStoreClient, namespace: bytes, keys: Sequence[bytes]
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(start position, K, V [layers, tokens, kv_heads, D]) of consecutive chunks."""
    if not keys:
        raise InvalidArgument("no chunk_keys")
    try:
        chunks = await kvstore.get_chunks(namespace, keys)
    except grpc.RpcError as exc:
        meant = _DAEMON_REFUSALS.get(exc.code())
        if meant is not None:  # the caller's mistake, as the daemon saw it
            raise meant(f"the daemon refused the chunks: {exc.details()}") from exc
        raise Unavailable(f"the daemon did not answer: {exc.code().name} {exc.details()}") from exc
    headers = [chunk.layout.header for chunk in chunks]
    for index in range(1, len(headers)):
        if headers[index].base_position != headers[index - 1].base_position + headers[index - 1].tokens:
            raise InvalidArgument(
                f"chunk {index} does not follow chunk {index - 1}: positions are not consecutive"
            )
    layers = headers[0].num_layers
    k_layers, v_layers = [], []
    try:
        for layer in range(layers):
            pieces = []
            for index, chunk in enumerate(chunks):
                size = chunk.layout.header.layer_bytes
                data = memoryview(chunk.data)[layer * size : (layer + 1) * size]
                pieces.append(LayerPiece(index, layer, data, chunk.layout))
            k, v = layer_from_pieces(pieces, verify=True)  # [kv_heads, tokens, D]
            k_layers.append(k.transpose(0, 1))
            v_layers.append(v.transpose(0, 1))
    except KVShapeError as exc:
        raise InvalidArgument(f"the chunks do not form one segment: {exc}") from exc
    except ChunkCorruptError as exc:
        raise DataLoss(f"a stored chunk is corrupt: {exc}") from exc
    return headers[0].base_position, torch.stack(k_layers), torch.stack(v_layers)
