"""Between a sequence's per-layer KV and hidden states and restore chunks (format version
2, attnstore.chunks.format): each layer in the form its storage plan names.

    HIDDEN layer of chunk i     the layer's input hidden states [tokens, hidden_size]
    KV layer                    K then V, each [kv_heads, tokens, head_dim] (as kv_codec)
    NONE layer                  no bytes

Keys are the same chained chunk keys as KV, in the namespace of the storage plan.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnstore.chunks.format import (
    RESTORE_FORMAT_VERSION,
    ChunkHeader,
    LayerForm,
    encode_layers,
    verify_layer,
)
from attnstore.kvstore_client.results import LayerPiece
from inference_worker.kv_codec import (
    DTYPE_NAMES,
    TORCH_DTYPES,
    KVShapeError,
    _frombuffer,
    _raw_bytes,
    chunk_spans,
    encode_chunks,
)
from inference_worker.model_geometry import ModelGeometry
from inference_worker.restore.storage_plan import StoragePlan

KVLayers = Sequence[tuple[torch.Tensor, torch.Tensor] | None]  # per layer K, V [kv_heads, seq, D]
HiddenLayers = Sequence[torch.Tensor | None]  # per layer [seq, hidden]


def encode_restore_chunks(
    namespace: bytes,
    keys: Sequence[bytes],
    plan: StoragePlan,
    geometry: ModelGeometry,
    kv: KVLayers,
    hidden: HiddenLayers,
    chunk_tokens: int,
    base_position: int,
    *,
    include_partial: bool = False,
) -> list[bytes]:
    """One restore chunk per `chunk_tokens` tokens, keyed by `keys` in order: each layer's
    K and V (KV layers) or hidden states (HIDDEN layers) of the sequence whose token 0 sits
    at `base_position`. `kv` and `hidden` need entries only for the layers in their form
    (and one of them at least, even for a plan that stores nothing: the header's shape).
    An all-KV plan gives classic KV chunks (kv_codec)."""
    if plan.is_kv:
        return encode_chunks(
            namespace, keys, kv, chunk_tokens, base_position, include_partial=include_partial
        )
    forms = plan.forms
    if len(kv) != plan.num_layers or len(hidden) != plan.num_layers:
        raise KVShapeError(f"{len(kv)} KV and {len(hidden)} hidden layers for a {plan.num_layers}-layer plan")
    given_kv = next((pair for pair in kv if pair is not None), None)
    given_hidden = next((states for states in hidden if states is not None), None)
    if any(form is LayerForm.KV and kv[i] is None for i, form in enumerate(forms)) or any(
        form is LayerForm.HIDDEN and hidden[i] is None for i, form in enumerate(forms)
    ):
        raise KVShapeError(f"plan {plan.name} names a layer whose tensors were not given")
    if given_hidden is not None:
        (seq_tokens, hidden_size), dtype = given_hidden.shape, given_hidden.dtype
    elif given_kv is not None and LayerForm.HIDDEN not in forms:
        # No layer's size depends on the hidden width then; version 2 headers carry one > 0.
        seq_tokens, dtype, hidden_size = given_kv[0].shape[1], given_kv[0].dtype, 1
    else:
        raise KVShapeError("no tensors to take the chunks' tokens and widths from")
    spans = chunk_spans(seq_tokens, chunk_tokens, include_partial=include_partial)
    if len(keys) != len(spans):
        raise KVShapeError(f"{len(keys)} keys for {len(spans)} chunks of {seq_tokens} tokens")
    host_kv = [None if pair is None else (pair[0].cpu(), pair[1].cpu()) for pair in kv]
    host_hidden = [None if h is None else h.cpu() for h in hidden]
    chunks = []
    for key, (start, end) in zip(keys, spans, strict=True):
        layers: list[tuple[object, ...]] = []
        for form, pair, states in zip(forms, host_kv, host_hidden, strict=True):
            if form is LayerForm.KV:
                layers.append(tuple(_raw_bytes(t[:, start:end].contiguous()) for t in pair))
            elif form is LayerForm.HIDDEN:
                layers.append((_raw_bytes(states[start:end].contiguous()),))  # [tokens, hidden]
            else:
                layers.append(())
        header = ChunkHeader(
            namespace=namespace,
            key=key,
            dtype=DTYPE_NAMES[dtype],
            num_layers=plan.num_layers,
            kv_heads=geometry.kv_heads,
            tokens=end - start,
            head_dim=geometry.head_dim,
            base_position=base_position + start,
            layer_checksums=(),
            format_version=RESTORE_FORMAT_VERSION,
            layer_forms=forms,
            hidden_size=hidden_size,
        )
        chunks.append(encode_layers(header, layers))
    return chunks


def hidden_from_pieces(
    pieces: Sequence[LayerPiece], device: torch.device | str | None = None
) -> torch.Tensor:
    """The hidden states [sum of the chunks' tokens, hidden_size] of one HIDDEN layer, from
    its pieces of consecutive chunks in order (checksums verified)."""
    if not pieces:
        raise KVShapeError("no pieces to assemble")
    first = pieces[0].layout.header
    total = sum(piece.layout.header.tokens for piece in pieces)
    out = torch.empty((total, first.hidden_size), dtype=TORCH_DTYPES[first.dtype], device=device)
    start = 0
    for piece in pieces:
        header = piece.layout.header
        if header.is_kv or header.layer_forms[piece.layer] is not LayerForm.HIDDEN:
            raise KVShapeError(f"layer {piece.layer} of chunk {piece.chunk_index} holds no hidden states")
        if (header.dtype, header.hidden_size) != (first.dtype, first.hidden_size):
            raise KVShapeError(
                f"chunk {piece.chunk_index}: dtype or hidden size differs from the first chunk"
            )
        if len(piece.data) != header.layer_size(piece.layer):
            raise KVShapeError(f"chunk {piece.chunk_index}: {len(piece.data)} bytes for layer {piece.layer}")
        src = (
            _frombuffer(piece.data, 0, len(piece.data))
            .view(out.dtype)
            .view(header.tokens, header.hidden_size)
        )
        out[start : start + header.tokens].copy_(src)
        verify_layer(piece.layout, piece.layer, piece.data)
        start += header.tokens
    return out
