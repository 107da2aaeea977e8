"""The background prefix loader against a stand-in for the daemon's layer-major reads:
after a truncation it keeps only chunk 0's attention sinks and re-positions the chunks that
moved, bad reads fail the prefix (never raise), and each failure maps to the fallback a
turn reports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc
import pytest
import torch
from transformers import DynamicCache

from attnstore.chunks.format import ChunkCorruptError
from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from attnstore.errors import Unavailable
from attnstore.kvstore_client import DaemonProtocolError, LayerPiece
from inference_worker.kv_codec import encode_chunks
from inference_worker.layerwise_cache import PrefixKV, PrefixLoadFailed
from inference_worker.prefix_loader import classify_failure, load_prefix
from inference_worker.rotary_shift import PositionShiftUnsupported, RotaryShift
from inference_worker.turn_types import Fallback

CHUNK_TOKENS = 16
CPU = torch.device("cpu")
SINK_TOKENS = 4
NAMESPACE = NamespaceSpec(model_digest="tiny", dtype="float32", chunk_tokens=CHUNK_TOKENS).namespace_id()


class LayerMajorReads:
    """Yields given pieces in order, as AsyncKVStoreClient.iter_layers would."""

    def __init__(self, rows: Sequence[Sequence[LayerPiece]]) -> None:
        self.rows = rows

    async def iter_layers(
        self, namespace: bytes, keys: Sequence[bytes], places: Sequence[str] = ()
    ) -> AsyncIterator[LayerPiece]:
        for row in self.rows:
            for piece in row:
                yield piece


@torch.no_grad()
def kv_at(model, ids: torch.Tensor, first_position: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer K, V [kv_heads, tokens, head_dim] of `ids` [1, tokens] computed at positions
    first_position, first_position + 1, ..."""
    cache = DynamicCache()
    positions = torch.arange(first_position, first_position + ids.shape[1]).unsqueeze(0)  # [1, tokens]
    model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True)
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers]


def stored_chunks(model, ids: torch.Tensor) -> list[bytes]:
    """The prefix as the daemon holds it: computed at positions 0.., base position 0."""
    keys = chunk_key_chain(NAMESPACE, ids[0].tolist(), CHUNK_TOKENS)
    return encode_chunks(NAMESPACE, keys, kv_at(model, ids, 0), CHUNK_TOKENS, base_position=0)


async def load(
    model, rows, *, head_tokens: int, shift: RotaryShift | None, device: torch.device = CPU
) -> PrefixKV:
    chunks = len(rows[0]) if rows else 2
    prefix = PrefixKV(model.config.num_hidden_layers, head_tokens + (chunks - 1) * CHUNK_TOKENS)
    await load_prefix(
        LayerMajorReads(rows),  # type: ignore[arg-type]
        NAMESPACE,
        [bytes(32)] * chunks,
        prefix,
        chunk_tokens=CHUNK_TOKENS,
        head_tokens=head_tokens,
        shift=shift,
        device=device,
    )
    return prefix


def prompt(vocab_size: int, chunks: int = 2) -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    return torch.randint(0, vocab_size, (1, chunks * CHUNK_TOKENS), generator=generator)  # [1, tokens]


async def test_after_truncation_the_sinks_stay_and_kept_chunks_move(tiny_llama_factory, layer_major_pieces):
    # One layer: a token's K and V depend only on the token and its position, so the loaded
    # prefix must equal the kept tokens computed from scratch at their new positions.
    model = tiny_llama_factory(num_hidden_layers=1)
    ids = prompt(model.config.vocab_size, chunks=4)
    stored = stored_chunks(model, ids)
    rows = layer_major_pieces([stored[0], stored[2], stored[3]])  # chunk 2 moves from 32 to 4
    prefix = await load(model, rows, head_tokens=SINK_TOKENS, shift=RotaryShift(model))

    kept = torch.cat((ids[:, :SINK_TOKENS], ids[:, 2 * CHUNK_TOKENS :]), dim=1)  # [1, 4 + 32]
    ((k_expected, v_expected),) = kv_at(model, kept, 0)
    k, v = prefix.wait_layer(0, 1.0)
    assert k.shape == k_expected.shape == (2, SINK_TOKENS + 2 * CHUNK_TOKENS, 16)
    assert (k - k_expected).abs().max().item() <= 1e-4
    assert torch.equal(v, v_expected)  # values carry no position: the stored bytes


@pytest.mark.gpu
async def test_on_cuda_the_layers_arrive_finished_and_re_positioned(tiny_llama_factory, layer_major_pieces):
    """On a GPU the copies and the re-positioning run on a stream of their own
    (device_copies.py): the layer the forward takes is complete and equals the CPU's."""
    model = tiny_llama_factory(num_hidden_layers=1)
    ids = prompt(model.config.vocab_size, chunks=4)
    stored = stored_chunks(model, ids)
    rows = layer_major_pieces([stored[0], stored[2], stored[3]])  # chunk 2 moves from 32 to 4
    k_cpu, v_cpu = (await load(model, rows, head_tokens=SINK_TOKENS, shift=RotaryShift(model))).wait_layer(
        0, 1.0
    )
    on_gpu = model.to("cuda")
    prefix = await load(
        on_gpu, rows, head_tokens=SINK_TOKENS, shift=RotaryShift(on_gpu), device=torch.device("cuda")
    )
    k, v = prefix.wait_layer(0, 1.0)
    assert k.device.type == v.device.type == "cuda"
    assert (k.cpu() - k_cpu).abs().max().item() <= 1e-5
    assert torch.equal(v.cpu(), v_cpu)


async def test_chunks_at_their_stored_positions_load_unchanged(tiny_llama, layer_major_pieces):
    ids = prompt(tiny_llama.config.vocab_size)
    rows = layer_major_pieces(stored_chunks(tiny_llama, ids))
    same = await load(tiny_llama, rows, head_tokens=CHUNK_TOKENS, shift=None)  # nothing to rotate
    for layer, (k_stored, v_stored) in enumerate(kv_at(tiny_llama, ids, 0)):
        k, v = same.wait_layer(layer, 1.0)
        assert torch.equal(k, k_stored) and torch.equal(v, v_stored)


async def test_a_move_without_a_shift_fails_the_prefix(tiny_llama, layer_major_pieces):
    rows = layer_major_pieces(stored_chunks(tiny_llama, prompt(tiny_llama.config.vocab_size)))
    prefix = await load(tiny_llama, rows, head_tokens=SINK_TOKENS, shift=None)  # chunk 1 moves to 4
    with pytest.raises(PrefixLoadFailed) as failure:
        prefix.wait_layer(0, 1.0)
    assert isinstance(failure.value.__cause__, PositionShiftUnsupported)
    assert classify_failure(failure.value) is Fallback.CHUNK_INVALID


@pytest.mark.parametrize("damage", ["short", "reordered"])
async def test_a_bad_read_fails_the_prefix(tiny_llama, layer_major_pieces, damage):
    rows = layer_major_pieces(stored_chunks(tiny_llama, prompt(tiny_llama.config.vocab_size)))
    rows = rows[:1] if damage == "short" else [list(reversed(row)) for row in rows]
    prefix = await load(tiny_llama, rows, head_tokens=CHUNK_TOKENS, shift=None)
    last = tiny_llama.config.num_hidden_layers - 1
    with pytest.raises(PrefixLoadFailed) as failure:
        prefix.wait_layer(last, 1.0)
    assert isinstance(failure.value.__cause__, DaemonProtocolError)


def failed_because(cause: BaseException | None) -> PrefixLoadFailed:
    error = PrefixLoadFailed("load failed")
    error.__cause__ = cause
    return error


def rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="test")


@pytest.mark.parametrize(
    ("cause", "fallback"),
    [
        (None, Fallback.DEADLINE),  # a layer missed its deadline
        (rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED), Fallback.DEADLINE),
        (rpc_error(grpc.StatusCode.UNAVAILABLE), Fallback.DAEMON_UNAVAILABLE),
        (rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED), Fallback.DAEMON_UNAVAILABLE),  # keeps the chunks
        (rpc_error(grpc.StatusCode.NOT_FOUND), Fallback.CHUNK_INVALID),  # evicted after the lookup
        (Unavailable("arena changed"), Fallback.DAEMON_UNAVAILABLE),
        (ConnectionResetError(), Fallback.DAEMON_UNAVAILABLE),
        (ChunkCorruptError("layer 2"), Fallback.CHUNK_INVALID),
    ],
)
def test_failures_map_to_fallbacks(cause: BaseException | None, fallback: Fallback) -> None:
    assert classify_failure(failed_because(cause)) is fallback
