"""Restore chunks (format version 2): each layer in its storage plan's form, round trips
bit-exact, with a header that says so; a reader of KV never takes one for KV."""

from __future__ import annotations

import pytest
import torch

from attnstore.chunks.format import (
    ChunkFormatError,
    ChunkHeader,
    LayerForm,
    decode_layout,
    encode_chunk,
    encode_layers,
    max_chunk_bytes,
)
from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from inference_worker.kv_codec import KVShapeError, encode_chunks, layer_from_pieces
from inference_worker.layerwise_cache import PrefixKV, PrefixLoadFailed
from inference_worker.model_geometry import ModelGeometry
from inference_worker.prefix_loader import classify_failure, load_prefix
from inference_worker.restore.codec import encode_restore_chunks, hidden_from_pieces
from inference_worker.restore.storage_plan import HiddenStatesNotSmaller, StoragePlan
from inference_worker.turn_types import Fallback

CHUNK = 8
TOKENS = 2 * CHUNK + 3  # two full chunks and a partial one
GEOMETRY = ModelGeometry(num_layers=4, heads=4, kv_heads=4, head_dim=8, max_positions=512, vocab_size=256)
HIDDEN = 32  # multi-head: hidden states are as wide as K alone
PLAN = StoragePlan(4, recompute_layers=1, hidden_layers=2)  # NONE, HIDDEN, HIDDEN, KV
SPEC = NamespaceSpec(model_digest="tiny", dtype="float32", chunk_tokens=CHUNK, storage_plan=PLAN.name)
NAMESPACE = SPEC.namespace_id()


def tensors():
    generator = torch.Generator().manual_seed(0)
    kv = [tuple(torch.randn(4, TOKENS, 8, generator=generator) for _ in range(2)) for _ in range(4)]
    hidden = [torch.randn(TOKENS, HIDDEN, generator=generator) for _ in range(4)]
    return kv, hidden


def restore_chunks(kv, hidden) -> list[bytes]:
    keys = chunk_key_chain(NAMESPACE, list(range(TOKENS)), CHUNK, include_partial=True)
    return encode_restore_chunks(
        NAMESPACE, keys, PLAN, GEOMETRY, kv, hidden, CHUNK, base_position=0, include_partial=True
    )


def test_each_layer_round_trips_in_its_form(layer_major_pieces) -> None:
    kv, hidden = tensors()
    chunks = restore_chunks(kv, hidden)
    header = decode_layout(chunks[0]).header
    assert header.layer_forms == (LayerForm.NONE, LayerForm.HIDDEN, LayerForm.HIDDEN, LayerForm.KV)
    assert not header.is_kv and header.format_version == 2 and header.hidden_size == HIDDEN
    assert [header.layer_size(layer) for layer in range(4)] == [
        0,
        CHUNK * HIDDEN * 4,
        CHUNK * HIDDEN * 4,
        2 * 4 * CHUNK * 8 * 4,
    ]
    rows = layer_major_pieces(chunks)
    assert rows[0][0].data == b""
    for layer in (1, 2):
        assert torch.equal(hidden_from_pieces(rows[layer]), hidden[layer])
    k, v = layer_from_pieces(rows[3], verify=True, restore_chunks=True)
    assert torch.equal(k, kv[3][0]) and torch.equal(v, kv[3][1])
    with pytest.raises(KVShapeError, match="holds no KV"):
        layer_from_pieces(rows[1], restore_chunks=True)  # a hidden layer is not KV
    with pytest.raises(KVShapeError, match="holds no hidden"):
        hidden_from_pieces(rows[3])


def test_a_restore_chunk_stores_less_than_kv_and_fits_the_namespace_limit() -> None:
    kv, hidden = tensors()
    full = restore_chunks(kv, hidden)[0]
    limit = max_chunk_bytes(num_layers=4, kv_heads=4, head_dim=8, chunk_tokens=CHUNK, dtype="float32")
    assert len(full) <= limit
    assert (
        PLAN.bytes_per_token(GEOMETRY, HIDDEN, 4) == (2 * HIDDEN + 1 * 2 * 32) * 4
    )  # vs 4 * 2 * 32 * 4 for KV


async def test_a_kv_reader_rejects_a_restore_chunk(layer_major_pieces) -> None:
    """Even a chunk whose layers are all hidden states, of a KV chunk's exact size per layer."""
    kv, hidden = tensors()
    rows = layer_major_pieces(restore_chunks(kv, hidden))
    with pytest.raises(KVShapeError, match="holds no KV"):
        layer_from_pieces(rows[3], verify=True)  # a KV layer of a restore chunk: not without restore_chunks

    class Reads:
        async def iter_layers(self, namespace, keys):
            for row in rows:
                for piece in row:
                    yield piece

    prefix = PrefixKV(4, TOKENS)
    await load_prefix(
        Reads(),
        NAMESPACE,
        [bytes(32)] * 3,
        prefix,
        chunk_tokens=CHUNK,
        head_tokens=CHUNK,  # type: ignore[arg-type]
        shift=None,
        device=torch.device("cpu"),
        tail_tokens=3,
    )
    with pytest.raises(PrefixLoadFailed) as failure:
        prefix.wait_layer(0, 1.0)
    assert classify_failure(failure.value) is Fallback.CHUNK_INVALID


def test_kv_chunks_and_their_namespaces_are_unchanged() -> None:
    """Version 1 stays byte-identical, and a plan's namespace differs from the KV one."""
    kv, _ = tensors()
    plain = NamespaceSpec(model_digest="tiny", dtype="float32", chunk_tokens=CHUNK)
    keys = chunk_key_chain(plain.namespace_id(), list(range(TOKENS)), CHUNK)
    (chunk, _) = encode_chunks(plain.namespace_id(), keys, kv, CHUNK, 0)
    header = decode_layout(chunk).header
    assert header.is_kv and header.format_version == 1
    direct = encode_chunk(
        namespace=plain.namespace_id(),
        key=keys[0],
        dtype="float32",
        kv_heads=4,
        tokens=CHUNK,
        head_dim=8,
        base_position=0,
        layers=[(k[:, :CHUNK].contiguous().numpy(), v[:, :CHUNK].contiguous().numpy()) for k, v in kv],
    )
    assert direct == chunk
    assert plain.namespace_id() != NAMESPACE


@pytest.mark.parametrize("version", [1, 2])
def test_forms_go_with_version_2_only(version: int) -> None:
    """A version 1 header with forms, or a version 2 one without: not a chunk."""
    forms = (LayerForm.HIDDEN,) if version == 1 else ()
    header = ChunkHeader(
        namespace=NAMESPACE,
        key=bytes(32),
        dtype="float32",
        num_layers=1,
        kv_heads=4,
        tokens=CHUNK,
        head_dim=8,
        base_position=0,
        layer_checksums=(),
        format_version=version,
        layer_forms=forms,
        hidden_size=HIDDEN if forms else 0,
    )
    layer = (bytes(header.layer_size(0)),) if forms else (bytes(header.layer_bytes // 2),) * 2
    with pytest.raises(ChunkFormatError, match="version 2 only"):
        decode_layout(encode_layers(header, [layer]))


def test_a_gqa_model_keeps_kv() -> None:
    smol = ModelGeometry(
        num_layers=30, heads=9, kv_heads=3, head_dim=64, max_positions=8192, vocab_size=49152
    )
    StoragePlan(30, recompute_layers=3).check(smol, 576)  # recomputation alone is fine
    with pytest.raises(HiddenStatesNotSmaller):
        StoragePlan(30, hidden_layers=1).check(smol, 576)


def test_a_plan_that_stores_nothing_gives_header_only_chunks() -> None:
    kv, _ = tensors()
    keys = chunk_key_chain(NAMESPACE, list(range(TOKENS)), CHUNK)
    nothing = StoragePlan(4, recompute_layers=4)
    chunks = encode_restore_chunks(NAMESPACE, keys, nothing, GEOMETRY, kv, [None] * 4, CHUNK, 0)
    layout = decode_layout(chunks[0])
    assert layout.header.layer_forms == (LayerForm.NONE,) * 4
    assert len(chunks[0]) == layout.total_bytes == layout.data_offset
