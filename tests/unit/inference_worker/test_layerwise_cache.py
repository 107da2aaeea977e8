"""A prefix loaded layer by layer (through the chunk format) into a sequence's pool blocks
during the paged forward of only the new tokens must give what full recomputation gives."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import DynamicCache

from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.model_runner import PagedModelRunner, SequencePrefixFailed, Work
from inference_worker.engine.sequence import Sequence
from inference_worker.kv_codec import encode_chunks, layer_from_pieces
from inference_worker.layerwise_cache import PrefixKV, PrefixLoadFailed
from inference_worker.model_geometry import ModelGeometry

CHUNK_TOKENS = 16
PREFIX_TOKENS = 2 * CHUNK_TOKENS
NEW_TOKENS = 7
DECODE_STEPS = 32
BLOCK_TOKENS = 8
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


class PagedTurn:
    """One sequence on a paged runner: prefill of the new tokens over a loading prefix, then
    greedy decoding."""

    def __init__(self, model, ids: torch.Tensor, prefix: PrefixKV, timeout_seconds: float = TIMEOUT_SECONDS):
        blocks = 16
        kv = PagedKV(ModelGeometry.of(model.config), blocks, BLOCK_TOKENS, torch.float32, torch.device("cpu"))
        self.runner = PagedModelRunner(model, kv, layer_timeout_seconds=timeout_seconds)
        self.pool = BlockPool(blocks, BLOCK_TOKENS)
        self.seq = Sequence.of(ids[0].tolist())
        self.pool.allocate(self.seq)
        self.seq.prefix, self.seq.computed_tokens = prefix, prefix.prefix_tokens  # as the scheduler admits it

    def run(self, tokens: int) -> torch.Tensor:
        logits = self.runner.forward(self.runner.prepare([Work(self.seq, tokens)]))[0]  # [vocab]
        self.seq.prefix = None
        self.pool.commit(self.seq, len(self.seq))
        return logits

    def greedy(self, logits: torch.Tensor) -> list[int]:
        tokens = []
        for _ in range(DECODE_STEPS):
            tokens.append(int(logits.argmax()))
            self.seq.token_ids.append(tokens[-1])
            self.pool.append_slot(self.seq)
            logits = self.run(1)
        return tokens


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_layerwise_load_matches_full_recompute(tiny_llama_factory, layer_major_pieces, attn_implementation):
    """`attn_implementation` is the reference's: the paged forward is the same either way."""
    model = tiny_llama_factory(attn_implementation)
    ids = prompt(model.config.vocab_size)
    ref_logits, ref_tokens = full_recompute(model, ids)
    pieces = layer_major_pieces(prefix_chunks(model, ids))

    # Layer by layer, with the loader behind the forward pass.
    prefix = WatchedPrefixKV(model.config.num_hidden_layers, PREFIX_TOKENS)
    loader = start_loader(prefix, pieces, delay_seconds=LAYER_DELAY_SECONDS)
    turn = PagedTurn(model, ids, prefix)
    logits = turn.run(NEW_TOKENS)
    loader.join()
    tokens = turn.greedy(logits)

    # The forward waited for every layer, each at least the loader's delay.
    assert turn.seq.load_wait_seconds >= model.config.num_hidden_layers * LAYER_DELAY_SECONDS
    assert prefix.load_seconds is not None and prefix.load_seconds >= 3 * LAYER_DELAY_SECONDS
    assert (logits - ref_logits).abs().max().item() <= 1e-4
    assert tokens == ref_tokens

    # Everything loaded before the forward starts: the same computation, the same numbers.
    loaded = PrefixKV(model.config.num_hidden_layers, PREFIX_TOKENS)
    for layer, layer_pieces in enumerate(pieces):
        loaded.put_layer(layer, *layer_from_pieces(layer_pieces))
    eager = PagedTurn(model, ids, loaded)
    eager_logits = eager.run(NEW_TOKENS)
    assert torch.equal(eager_logits, logits)
    assert eager.greedy(eager_logits) == tokens


@pytest.mark.timeout(60)
def test_sliding_window_layers(tiny_mistral_factory, layer_major_pieces):
    """A window shorter than the prefix: the loaded keys it excludes stay masked."""
    model = tiny_mistral_factory(sliding_window=24)
    ids = prompt(model.config.vocab_size)
    ref_logits, ref_tokens = full_recompute(model, ids)
    prefix = PrefixKV(model.config.num_hidden_layers, PREFIX_TOKENS)
    loader = start_loader(prefix, layer_major_pieces(prefix_chunks(model, ids)), delay_seconds=0.01)

    turn = PagedTurn(model, ids, prefix)
    logits = turn.run(NEW_TOKENS)
    loader.join()

    assert (logits - ref_logits).abs().max().item() <= 1e-4
    assert turn.greedy(logits) == ref_tokens


@pytest.mark.timeout(30)
def test_loader_failure_surfaces_as_prefix_load_failed(tiny_llama, layer_major_pieces):
    ids = prompt(tiny_llama.config.vocab_size)
    prefix = PrefixKV(tiny_llama.config.num_hidden_layers, PREFIX_TOKENS)
    pieces = layer_major_pieces(prefix_chunks(tiny_llama, ids))
    loader = start_loader(prefix, pieces, delay_seconds=0.01, fail_at=1)

    turn = PagedTurn(tiny_llama, ids, prefix)
    with pytest.raises(SequencePrefixFailed) as failure:
        turn.run(NEW_TOKENS)
    loader.join()
    assert failure.value.seq is turn.seq
    cause = failure.value.__cause__
    assert isinstance(cause, PrefixLoadFailed) and "before layer 1" in str(cause)
    assert isinstance(cause.__cause__, ConnectionError)


@pytest.mark.timeout(30)
def test_a_stalled_loader_times_out(tiny_llama):
    ids = prompt(tiny_llama.config.vocab_size)
    prefix = PrefixKV(tiny_llama.config.num_hidden_layers, PREFIX_TOKENS)  # nobody feeds it
    turn = PagedTurn(tiny_llama, ids, prefix, timeout_seconds=0.2)

    started = time.monotonic()
    with pytest.raises(SequencePrefixFailed) as failure:
        turn.run(NEW_TOKENS)
    assert "did not arrive within" in str(failure.value.__cause__)
    assert 0.2 <= turn.seq.load_wait_seconds and time.monotonic() - started < 5


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
