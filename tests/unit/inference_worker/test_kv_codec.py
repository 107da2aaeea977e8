import dataclasses

import pytest
import torch

from attnstore.chunks.format import ChunkCorruptError, decode_layout, verify_layers
from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from inference_worker.kv_codec import KVShapeError, chunk_spans, encode_chunks, layer_from_pieces

CHUNK_TOKENS = 16
NUM_LAYERS, KV_HEADS, HEAD_DIM = 3, 2, 8


def random_kv(seq: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seq)
    shape = (KV_HEADS, seq, HEAD_DIM)
    return [
        (torch.randn(shape, generator=generator).to(dtype), torch.randn(shape, generator=generator).to(dtype))
        for _ in range(NUM_LAYERS)
    ]


def namespace_and_keys(dtype: str, seq: int, include_partial: bool) -> tuple[bytes, list[bytes]]:
    namespace = NamespaceSpec(model_digest="tiny", dtype=dtype, chunk_tokens=CHUNK_TOKENS).namespace_id()
    tokens = list(range(seq))
    return namespace, chunk_key_chain(namespace, tokens, CHUNK_TOKENS, include_partial=include_partial)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)


def test_chunk_spans() -> None:
    assert chunk_spans(40, 16) == [(0, 16), (16, 32)]
    assert chunk_spans(40, 16, include_partial=True) == [(0, 16), (16, 32), (32, 40)]
    assert chunk_spans(32, 16, include_partial=True) == [(0, 16), (16, 32)]
    assert chunk_spans(15, 16) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("include_partial", [False, True])
def test_round_trip_is_bit_exact(dtype, include_partial, layer_major_pieces) -> None:
    seq, base_position = 40, 1000
    kv = random_kv(seq, dtype)
    dtype_name = str(dtype).removeprefix("torch.")
    namespace, keys = namespace_and_keys(dtype_name, seq, include_partial)
    chunks = encode_chunks(namespace, keys, kv, CHUNK_TOKENS, base_position, include_partial=include_partial)

    covered = 40 if include_partial else 32
    assert len(chunks) == len(keys) == (3 if include_partial else 2)
    for index, chunk in enumerate(chunks):
        layout = decode_layout(chunk)
        header = layout.header
        assert header.key == keys[index] and header.dtype == dtype_name
        assert header.base_position == base_position + index * CHUNK_TOKENS
        assert header.tokens == min(CHUNK_TOKENS, covered - index * CHUNK_TOKENS)
        verify_layers(chunk, layout, 0, NUM_LAYERS)

    for layer, pieces in enumerate(layer_major_pieces(chunks)):
        k, v = layer_from_pieces(pieces)
        assert k.shape == v.shape == (KV_HEADS, covered, HEAD_DIM) and k.dtype == dtype
        assert torch.equal(bits(k), bits(kv[layer][0][:, :covered]))
        assert torch.equal(bits(v), bits(kv[layer][1][:, :covered]))


def test_layer_from_pieces_fills_the_given_buffers(layer_major_pieces) -> None:
    kv = random_kv(32, torch.bfloat16)
    namespace, keys = namespace_and_keys("bfloat16", 32, False)
    pieces = layer_major_pieces(encode_chunks(namespace, keys, kv, CHUNK_TOKENS, 0))[1]
    out_k = torch.empty((KV_HEADS, 32, HEAD_DIM), dtype=torch.bfloat16)
    out_v = torch.empty_like(out_k)

    k, v = layer_from_pieces(pieces, out=(out_k, out_v))

    assert k is out_k and v is out_v
    assert torch.equal(bits(k), bits(kv[1][0])) and torch.equal(bits(v), bits(kv[1][1]))
    with pytest.raises(KVShapeError):
        layer_from_pieces(pieces, out=(out_k[:, :16], out_v[:, :16]))


def test_layer_from_pieces_converts_to_the_dtype_asked_for_in_its_copy(layer_major_pieces) -> None:
    """bf16 chunks read into fp32 (module KV stored narrow, served in the model's dtype)."""
    kv = random_kv(40, torch.bfloat16)
    namespace, keys = namespace_and_keys("bfloat16", 40, True)
    pieces = layer_major_pieces(encode_chunks(namespace, keys, kv, CHUNK_TOKENS, 0, include_partial=True))[2]

    k, v = layer_from_pieces(pieces, dtype=torch.float32)

    assert k.dtype == v.dtype == torch.float32
    assert torch.equal(k, kv[2][0].float()) and torch.equal(v, kv[2][1].float())
    with pytest.raises(KVShapeError):  # buffers of another dtype than the one asked for
        layer_from_pieces(
            pieces, out=(torch.empty_like(k).bfloat16(), torch.empty_like(v).bfloat16()), dtype=torch.float32
        )


def test_verify_refuses_a_damaged_piece(layer_major_pieces) -> None:
    kv = random_kv(32, torch.float32)
    namespace, keys = namespace_and_keys("float32", 32, False)
    pieces = layer_major_pieces(encode_chunks(namespace, keys, kv, CHUNK_TOKENS, 0))[2]
    k, _ = layer_from_pieces(pieces, verify=True)  # intact: verified and assembled
    assert torch.equal(bits(k), bits(kv[2][0]))
    damaged = bytearray(pieces[1].data)
    damaged[-1] ^= 0x01  # the last byte of V of the second chunk
    pieces[1] = dataclasses.replace(pieces[1], data=bytes(damaged))
    layer_from_pieces(pieces)  # unverified, the damage passes unseen
    with pytest.raises(ChunkCorruptError, match="layer 2 of chunk"):
        layer_from_pieces(pieces, verify=True)


def test_encode_from_a_strided_slice(layer_major_pieces) -> None:
    """The save path slices new chunks out of the cache's [kv_heads, seq, head_dim] tensors."""
    kv = random_kv(48, torch.float32)
    new = [(k[:, 16:48], v[:, 16:48]) for k, v in kv]  # non-contiguous views
    namespace, keys = namespace_and_keys("float32", 48, False)

    chunks = encode_chunks(namespace, keys[1:], new, CHUNK_TOKENS, base_position=16)

    assert [decode_layout(chunk).header.base_position for chunk in chunks] == [16, 32]
    k, _ = layer_from_pieces(layer_major_pieces(chunks)[2])
    assert torch.equal(k, kv[2][0][:, 16:48])


def test_mismatched_inputs_are_rejected(layer_major_pieces) -> None:
    kv = random_kv(40, torch.float32)
    namespace, keys = namespace_and_keys("float32", 40, False)
    with pytest.raises(KVShapeError, match="3 keys for 2 chunks"):
        encode_chunks(namespace, [*keys, keys[0]], kv, CHUNK_TOKENS, 0)
    with pytest.raises(KVShapeError, match="layer 1"):
        encode_chunks(namespace, keys, [kv[0], (kv[1][0][:, :32], kv[1][1][:, :32])], CHUNK_TOKENS, 0)
    with pytest.raises(KVShapeError, match="cannot be stored"):
        encode_chunks(namespace, keys, [(k.double(), v.double()) for k, v in kv], CHUNK_TOKENS, 0)

    per_layer = layer_major_pieces(encode_chunks(namespace, keys, kv, CHUNK_TOKENS, 0))
    with pytest.raises(KVShapeError, match="mixed"):
        layer_from_pieces([per_layer[0][0], per_layer[1][1]])
