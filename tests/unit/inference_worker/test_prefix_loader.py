"""The background prefix loader against a stand-in for the daemon's layer-major reads:
chunks stored at another position come back re-positioned, bad reads fail the prefix
(never raise), and each failure maps to the fallback a turn reports."""

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
PREFIX_TOKENS = 2 * CHUNK_TOKENS
NAMESPACE = NamespaceSpec(model_digest="tiny", dtype="float32", chunk_tokens=CHUNK_TOKENS).namespace_id()


class LayerMajorReads:
    """Yields given pieces in order, as AsyncKVStoreClient.iter_layers would."""

    def __init__(self, rows: Sequence[Sequence[LayerPiece]]) -> None:
        self.rows = rows

    async def iter_layers(self, namespace: bytes, keys: Sequence[bytes]) -> AsyncIterator[LayerPiece]:
        for row in self.rows:
            for piece in row:
                yield piece


@torch.no_grad()
def kv_at(model, ids: torch.Tensor, first_position: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer K, V [kv_heads, tokens, head_dim] of `ids` [1, tokens] computed at positions
    first_position, first_position + 1, ..."""
    cache = DynamicCache()
    positions = torch.arange(first_position, first_position + ids.shape[1]).unsqueeze(0)  # [1, tokens]
    model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers]


def stored_chunks(model, ids: torch.Tensor) -> list[bytes]:
    """The prefix as the daemon holds it: computed at positions 0.., base position 0."""
    keys = chunk_key_chain(NAMESPACE, ids[0].tolist(), CHUNK_TOKENS)
    return encode_chunks(NAMESPACE, keys, kv_at(model, ids, 0), CHUNK_TOKENS, base_position=0)


async def load(model, rows, *, first_position: int, shift: RotaryShift | None) -> PrefixKV:
    prefix = PrefixKV(model.config.num_hidden_layers, PREFIX_TOKENS)
    keys = [bytes(32)] * (PREFIX_TOKENS // CHUNK_TOKENS)
    await load_prefix(
        LayerMajorReads(rows),  # type: ignore[arg-type]
        NAMESPACE,
        keys,
        prefix,
        chunk_tokens=CHUNK_TOKENS,
        first_position=first_position,
        shift=shift,
        device=torch.device("cpu"),
    )
    return prefix


def prompt(vocab_size: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (1, PREFIX_TOKENS), generator=torch.Generator().manual_seed(5))


async def test_chunks_stored_elsewhere_are_repositioned(tiny_llama, layer_major_pieces):
    ids = prompt(tiny_llama.config.vocab_size)
    rows = layer_major_pieces(stored_chunks(tiny_llama, ids))
    moved = 8  # e.g. 8 tokens dropped in front by truncation: the chunks now sit at 8..39
    prefix = await load(tiny_llama, rows, first_position=moved, shift=RotaryShift(tiny_llama))

    for layer, (k_expected, v_expected) in enumerate(kv_at(tiny_llama, ids, moved)):
        k, v = prefix.wait_layer(layer, 1.0)
        assert (k - k_expected).abs().max().item() <= 1e-4
        assert (v - v_expected).abs().max().item() <= 1e-4  # values carry no position

    # At the stored position nothing is rotated: the loaded bytes are the stored ones.
    same = await load(tiny_llama, rows, first_position=0, shift=None)
    for layer, (k_stored, _) in enumerate(kv_at(tiny_llama, ids, 0)):
        assert torch.equal(same.wait_layer(layer, 1.0)[0], k_stored)


async def test_a_move_without_a_shift_fails_the_prefix(tiny_llama, layer_major_pieces):
    rows = layer_major_pieces(stored_chunks(tiny_llama, prompt(tiny_llama.config.vocab_size)))
    prefix = await load(tiny_llama, rows, first_position=CHUNK_TOKENS, shift=None)
    with pytest.raises(PrefixLoadFailed) as failure:
        prefix.wait_layer(0, 1.0)
    assert isinstance(failure.value.__cause__, PositionShiftUnsupported)
    assert classify_failure(failure.value) is Fallback.CHUNK_INVALID


@pytest.mark.parametrize("damage", ["short", "reordered"])
async def test_a_bad_read_fails_the_prefix(tiny_llama, layer_major_pieces, damage):
    rows = layer_major_pieces(stored_chunks(tiny_llama, prompt(tiny_llama.config.vocab_size)))
    rows = rows[:1] if damage == "short" else [list(reversed(row)) for row in rows]
    prefix = await load(tiny_llama, rows, first_position=0, shift=None)
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
        (rpc_error(grpc.StatusCode.NOT_FOUND), Fallback.CHUNK_INVALID),  # evicted after the lookup
        (Unavailable("arena changed"), Fallback.DAEMON_UNAVAILABLE),
        (ConnectionResetError(), Fallback.DAEMON_UNAVAILABLE),
        (ChunkCorruptError("layer 2"), Fallback.CHUNK_INVALID),
    ],
)
def test_failures_map_to_fallbacks(cause: BaseException | None, fallback: Fallback) -> None:
    assert classify_failure(failed_because(cause)) is fallback
