"""Between a model's per-layer KV tensors and attnstore chunks.

Shapes, batch squeezed (the worker runs one sequence per forward pass):

    kv[layer] = (K, V)      each [kv_heads, seq, head_dim], the model's dtype
    chunk i                 tokens [i * chunk_tokens, (i + 1) * chunk_tokens) of `seq`,
                            base position base_position + i * chunk_tokens
    LayerPiece.data         one layer of one chunk: K then V, each [kv_heads, tokens, head_dim]

Tensors travel as raw bytes (a uint8 view), so bf16, which has no numpy dtype, is
handled like the others, and a round trip is bit-exact.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

from attnstore.chunks.format import DTYPE_BYTES, LayerForm, encode_chunk, verify_layer
from attnstore.kvstore_client.results import LayerPiece

# torch warns that a tensor over read-only bytes (a chunk, a view of the leased arena) is
# writable through torch; these tensors are only ever copy sources.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in TORCH_DTYPES.items()}


class KVShapeError(ValueError):
    """KV tensors or layer pieces do not have the shapes, dtypes or counts that were asked for."""


def chunk_spans(
    seq_tokens: int, chunk_tokens: int, *, include_partial: bool = False
) -> list[tuple[int, int]]:
    """Token ranges [start, end) of the chunks of a `seq_tokens` sequence; the partial
    tail (fewer than `chunk_tokens`) only when asked for."""
    if chunk_tokens <= 0:
        raise KVShapeError(f"chunk_tokens must be positive, got {chunk_tokens}")
    end = seq_tokens if include_partial else seq_tokens - seq_tokens % chunk_tokens
    return [(start, min(start + chunk_tokens, end)) for start in range(0, end, chunk_tokens)]


def _raw_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A flat uint8 numpy view of a contiguous CPU tensor's bytes (no copy)."""
    return tensor.view(torch.uint8).reshape(-1).numpy()


def encode_chunks(
    namespace: bytes,
    keys: Sequence[bytes],
    kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
    chunk_tokens: int,
    base_position: int,
    *,
    include_partial: bool = False,
) -> list[bytes]:
    """Serializes `kv` (per layer K, V [kv_heads, seq, head_dim]; token 0 at `base_position`)
    into one chunk per `chunk_tokens` tokens, keyed by `keys` in order. Only full chunks
    unless `include_partial`; `keys` must name exactly the chunks produced."""
    if not kv:
        raise KVShapeError("no layers to encode")
    kv_heads, seq_tokens, head_dim = kv[0][0].shape
    dtype = kv[0][0].dtype
    if dtype not in DTYPE_NAMES:
        raise KVShapeError(f"dtype {dtype} cannot be stored in a chunk")
    for layer, (k, v) in enumerate(kv):
        if k.shape != (kv_heads, seq_tokens, head_dim) or v.shape != k.shape:
            raise KVShapeError(f"layer {layer}: K {tuple(k.shape)} / V {tuple(v.shape)} differ from layer 0")
        if k.dtype != dtype or v.dtype != dtype:
            raise KVShapeError(f"layer {layer}: dtype differs from layer 0")
    spans = chunk_spans(seq_tokens, chunk_tokens, include_partial=include_partial)
    if len(keys) != len(spans):
        raise KVShapeError(f"{len(keys)} keys for {len(spans)} chunks of {seq_tokens} tokens")

    # One device-to-host copy per tensor, then per-chunk slices on the host.
    host = [(k.detach().cpu(), v.detach().cpu()) for k, v in kv]  # each [kv_heads, seq, head_dim]
    chunks: list[bytes] = []
    for key, (start, end) in zip(keys, spans, strict=True):
        layers = [
            # [kv_heads, end - start, head_dim] made contiguous, viewed as bytes
            (_raw_bytes(k[:, start:end, :].contiguous()), _raw_bytes(v[:, start:end, :].contiguous()))
            for k, v in host
        ]
        chunks.append(
            encode_chunk(
                namespace=namespace,
                key=key,
                dtype=DTYPE_NAMES[dtype],
                kv_heads=kv_heads,
                tokens=end - start,
                head_dim=head_dim,
                base_position=base_position + start,
                layers=layers,
            )
        )
    return chunks


def layer_from_pieces(
    pieces: Sequence[LayerPiece],
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    device: torch.device | str | None = None,
    verify: bool = False,
    restore_chunks: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [kv_heads, sum of the chunks' tokens, head_dim] of one layer, from that layer's
    pieces of consecutive chunks in order. Each piece is copied once, straight from its
    bytes into its token slice of `out` (allocated on `device` when not given), converted
    to `dtype` in that copy when given (else the chunks' dtype). A restore
    chunk's layer (restore/) is taken only with `restore_chunks`, and only a KV layer.

    `verify` checks each piece against its layer checksum (ChunkCorruptError). Into host
    memory, right after the copy, over the source bytes the copy just pulled into cache
    (hashing them first would read DRAM twice; hashing the destination costs more, as
    large copies write around the cache); to an accelerator, before the copy."""
    if not pieces:
        raise KVShapeError("no pieces to assemble")
    first = pieces[0].layout.header
    layer = pieces[0].layer
    for piece in pieces:
        header = piece.layout.header
        if piece.layer != layer:
            raise KVShapeError(f"pieces of layers {layer} and {piece.layer} mixed")
        if not (header.is_kv or (restore_chunks and header.layer_forms[layer] is LayerForm.KV)):
            raise KVShapeError(f"layer {layer} of chunk {piece.chunk_index} holds no KV (a restore chunk)")
        if (header.dtype, header.kv_heads, header.head_dim) != (first.dtype, first.kv_heads, first.head_dim):
            raise KVShapeError(f"chunk {piece.chunk_index}: dtype or head shape differs from the first chunk")
        if len(piece.data) != header.layer_bytes:
            raise KVShapeError(
                f"chunk {piece.chunk_index}: {len(piece.data)} bytes for a {header.layer_bytes}-byte layer"
            )
    stored = TORCH_DTYPES[first.dtype]
    dtype = dtype or stored
    kv_heads, head_dim = first.kv_heads, first.head_dim
    total_tokens = sum(piece.layout.header.tokens for piece in pieces)
    shape = (kv_heads, total_tokens, head_dim)
    if out is None:
        out = (
            torch.empty(shape, dtype=dtype, device=device),  # K [kv_heads, total_tokens, head_dim]
            torch.empty(shape, dtype=dtype, device=device),  # V [kv_heads, total_tokens, head_dim]
        )
    out_k, out_v = out
    if out_k.shape != shape or out_v.shape != shape or out_k.dtype != dtype or out_v.dtype != dtype:
        raise KVShapeError(f"out buffers must be {shape} {dtype}")

    on_host = out_k.device.type == "cpu"
    start = 0
    for piece in pieces:
        tokens = piece.layout.header.tokens
        count = kv_heads * tokens * head_dim  # elements of K (and of V) in this piece
        half = count * DTYPE_BYTES[first.dtype]
        if verify and not on_host:
            verify_layer(piece.layout, piece.layer, piece.data)
        for target, offset in ((out_k, 0), (out_v, half)):
            # A read-only view of the piece's bytes: [kv_heads, tokens, head_dim]
            src = _frombuffer(piece.data, offset, half).view(stored).view(kv_heads, tokens, head_dim)
            target[:, start : start + tokens, :].copy_(src)
        if verify and on_host:
            verify_layer(piece.layout, piece.layer, piece.data)
        start += tokens
    return out_k, out_v


def _frombuffer(data: bytes | bytearray | memoryview, offset: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over `data[offset:offset + nbytes]`, without copying."""
    return torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=offset)
