"""A prefix loaded layer by layer (through the chunk format) and a prefill of only the new
tokens must give what full recomputation gives."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import DynamicCache

from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from inference_worker.kv_codec import encode_chunks, layer_from_pieces
from inference_worker.layerwise_cache import LayerwiseCache, PrefixKV, PrefixLoadFailed

CHUNK_TOKENS = 16
PREFIX_TOKENS = 2 * CHUNK_TOKENS
NEW_TOKENS = 7
DECODE_STEPS = 32
LAYER_DELAY_SECONDS = 0.05
TIMEOUT_SECONDS = 10.0


def prompt(vocab_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab_size, (1, PREFIX_TOKENS + NEW_TOKENS), generator=generator)  # [1, T]


def positions(start: int, count: int) -> torch.Tensor:
    return torch.arange(start, start + count).unsqueeze(0)  # [1, count]


@torch.no_grad()
def greedy(model, cache, logits: torch.Tensor, next_position: int) -> list[int]:
    """DECODE_STEPS greedy tokens continuing from `logits` [vocab] of the last prompt token."""
    tokens = []
    for step in range(DECODE_STEPS):
        token = int(logits.argmax())
        tokens.append(token)
        out = model(
            input_ids=torch.tensor([[token]]),
            position_ids=positions(next_position + step, 1),
            cache=cache,
            use_cache=True,
        )
        logits = out.logits[0, -1]
    return tokens


@torch.no_grad()
def full_recompute(model, ids: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, cache=cache, use_cache=True).logits[0, -1]  # [vocab]
    return logits, greedy(model, cache, logits, ids.shape[1])


@torch.no_grad()
def prefix_chunks(model, ids: torch.Tensor) -> list[bytes]:
    """The prefix's KV as the daemon would hold it: computed by a forward pass, encoded.
    (A cache built without the config keeps every token, even of sliding-window layers.)"""
    cache = DynamicCache()
    model(input_ids=ids[:, :PREFIX_TOKENS], cache=cache, use_cache=True)
    kv = [(layer.keys[0], layer.values[0]) for layer in cache.layers]  # each [kv_heads, P, head_dim]
    namespace = NamespaceSpec(model_digest="tiny", dtype="float32", chunk_tokens=CHUNK_TOKENS).namespace_id()
    keys = chunk_key_chain(namespace, ids[0, :PREFIX_TOKENS].tolist(), CHUNK_TOKENS)
    return encode_chunks(namespace, keys, kv, CHUNK_TOKENS, base_position=0)


class WatchedPrefixKV(PrefixKV):
    """Tells the test loader when the forward pass starts waiting on each layer."""

    def __init__(self, num_layers: int, prefix_tokens: int) -> None:
        super().__init__(num_layers, prefix_tokens)
        self.waiting = [threading.Event() for _ in range(num_layers)]

    def wait_layer(self, layer: int, timeout_seconds: float):
        self.waiting[layer].set()
        return super().wait_layer(layer, timeout_seconds)


def start_loader(prefix: PrefixKV, per_layer_pieces, *, delay_seconds: float, fail_at: int | None = None):
    """A background loader handing over one layer at a time. Given a WatchedPrefixKV it stays
    behind the forward pass: layer l comes `delay_seconds` after the forward asked for it."""

    def run() -> None:
        for layer, pieces in enumerate(per_layer_pieces):
            if isinstance(prefix, WatchedPrefixKV) and not prefix.waiting[layer].wait(TIMEOUT_SECONDS):
                return
            time.sleep(delay_seconds)
            if layer == fail_at:
                prefix.fail(ConnectionError("daemon went away"))
                return
            prefix.put_layer(layer, *layer_from_pieces(pieces))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@torch.no_grad()
def cached_turn(model, ids, prefix: PrefixKV, *, pass_positions: bool = True):
    cache = LayerwiseCache(prefix, model.config, layer_timeout_seconds=TIMEOUT_SECONDS)
    new_ids = ids[:, PREFIX_TOKENS:]  # [1, NEW_TOKENS]
    position_ids = positions(PREFIX_TOKENS, NEW_TOKENS) if pass_positions else None
    out = model(input_ids=new_ids, position_ids=position_ids, cache=cache, use_cache=True)
    logits = out.logits[0, -1]  # [vocab]
    return cache, logits


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_layerwise_load_matches_full_recompute(tiny_llama_factory, layer_major_pieces, attn_implementation):
    model = tiny_llama_factory(attn_implementation)
    ids = prompt(model.config.vocab_size)
    ref_logits, ref_tokens = full_recompute(model, ids)
    pieces = layer_major_pieces(prefix_chunks(model, ids))

    # Layer by layer, with the loader behind the forward pass.
    prefix = WatchedPrefixKV(model.config.num_hidden_layers, PREFIX_TOKENS)
    loader = start_loader(prefix, pieces, delay_seconds=LAYER_DELAY_SECONDS)
    cache, logits = cached_turn(model, ids, prefix)
    loader.join()
    tokens = greedy(model, cache, logits, PREFIX_TOKENS + NEW_TOKENS)

    assert all(wait >= LAYER_DELAY_SECONDS for wait in cache.wait_seconds), cache.wait_seconds
    assert cache.exposed_load_seconds == pytest.approx(sum(cache.wait_seconds))
    assert prefix.load_seconds is not None and prefix.load_seconds >= 3 * LAYER_DELAY_SECONDS
    assert (logits - ref_logits).abs().max().item() <= 1e-4
    assert tokens == ref_tokens

    # Everything loaded before the forward starts: the same computation, the same numbers.
    loaded = PrefixKV(model.config.num_hidden_layers, PREFIX_TOKENS)
    for layer, layer_pieces in enumerate(pieces):
        loaded.put_layer(layer, *layer_from_pieces(layer_pieces))
    eager_cache, eager_logits = cached_turn(model, ids, loaded)
    assert torch.equal(eager_logits, logits)
    assert greedy(model, eager_cache, eager_logits, PREFIX_TOKENS + NEW_TOKENS) == tokens


@pytest.mark.timeout(60)
def test_default_positions_come_from_the_pending_prefix(tiny_llama, layer_major_pieces):
    """Without position ids, the model derives them from get_seq_length before any layer ran."""
    ids = prompt(tiny_llama.config.vocab_size)
    ref_logits, _ = full_recompute(tiny_llama, ids)
    prefix = PrefixKV(tiny_llama.config.num_hidden_layers, PREFIX_TOKENS)
    loader = start_loader(prefix, layer_major_pieces(prefix_chunks(tiny_llama, ids)), delay_seconds=0.01)

    cache, logits = cached_turn(tiny_llama, ids, prefix, pass_positions=False)
    loader.join()

    assert (logits - ref_logits).abs().max().item() <= 1e-4
    assert cache.get_seq_length() == PREFIX_TOKENS + NEW_TOKENS


@pytest.mark.timeout(60)
def test_sliding_window_layers(tiny_mistral_factory, layer_major_pieces):
    """A window shorter than the prefix: the mask must already slide before the layers arrive."""
    model = tiny_mistral_factory(sliding_window=24)
    ids = prompt(model.config.vocab_size)
    ref_logits, ref_tokens = full_recompute(model, ids)
    prefix = PrefixKV(model.config.num_hidden_layers, PREFIX_TOKENS)
    loader = start_loader(prefix, layer_major_pieces(prefix_chunks(model, ids)), delay_seconds=0.01)

    cache, logits = cached_turn(model, ids, prefix)
    loader.join()

    assert (logits - ref_logits).abs().max().item() <= 1e-4
    assert greedy(model, cache, logits, PREFIX_TOKENS + NEW_TOKENS) == ref_tokens


@pytest.mark.timeout(30)
def test_loader_failure_surfaces_as_prefix_load_failed(tiny_llama, layer_major_pieces):
    ids = prompt(tiny_llama.config.vocab_size)
    prefix = PrefixKV(tiny_llama.config.num_hidden_layers, PREFIX_TOKENS)
    pieces = layer_major_pieces(prefix_chunks(tiny_llama, ids))
    loader = start_loader(prefix, pieces, delay_seconds=0.01, fail_at=1)

    with pytest.raises(PrefixLoadFailed, match="before layer 1") as failure:
        cached_turn(tiny_llama, ids, prefix)
    loader.join()
    assert isinstance(failure.value.__cause__, ConnectionError)


@pytest.mark.timeout(30)
def test_a_stalled_loader_times_out(tiny_llama):
    ids = prompt(tiny_llama.config.vocab_size)
    prefix = PrefixKV(tiny_llama.config.num_hidden_layers, PREFIX_TOKENS)  # nobody feeds it
    cache = LayerwiseCache(prefix, tiny_llama.config, layer_timeout_seconds=0.2)

    started = time.monotonic()
    with pytest.raises(PrefixLoadFailed, match="did not arrive within"), torch.no_grad():
        tiny_llama(input_ids=ids[:, PREFIX_TOKENS:], cache=cache, use_cache=True)
    assert time.monotonic() - started < 5


def test_prefix_kv_contract():
    prefix = PrefixKV(num_layers=2, prefix_tokens=4)
    k = torch.zeros(2, 4, 8)  # [kv_heads, prefix_tokens, head_dim]
    with pytest.raises(ValueError, match="not"):
        prefix.put_layer(0, torch.zeros(2, 3, 8), torch.zeros(2, 3, 8))
    prefix.put_layer(0, k, k)
    with pytest.raises(ValueError, match="twice"):
        prefix.put_layer(0, k, k)
    assert prefix.load_seconds is None

    prefix.fail(RuntimeError("gone"))
    prefix.put_layer(1, k, k)  # ignored after failure
    assert prefix.wait_layer(0, 0.1)[0] is k  # delivered layers stay readable
    with pytest.raises(PrefixLoadFailed):
        prefix.wait_layer(1, 0.1)
