"""A stored module's KV arriving layer by layer (LayerFeed): indexing a layer waits for it,
a failed or late read raises PrefixLoadFailed, every layer's shape is checked on arrival; a
module served whole reaches the engine without a copy."""

from __future__ import annotations

import threading

import pytest
import torch

from inference_worker.layerwise_cache import PrefixLoadFailed
from inference_worker.modules.module_kv import LayerFeed, ModuleKV
from inference_worker.modules.module_prompt import CachedPiece, CachedSpan, ModulePrefix

LAYERS, TOKENS = 3, 4


def layer(value: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((2, TOKENS, 8), value), torch.full((2, TOKENS, 8), -value)  # [kv_heads, tokens, D]


def test_a_layer_is_waited_for_until_the_reader_puts_it() -> None:
    feed = LayerFeed(LAYERS, TOKENS, timeout_seconds=30.0)
    module = ModuleKV(tuple(range(TOKENS)), tuple(range(TOKENS)), feed)  # no layer read yet
    got: list[tuple[torch.Tensor, torch.Tensor]] = []
    waiting = threading.Thread(target=lambda: got.append(module.kv[1]))
    waiting.start()
    feed.put(1, *layer(1.0))
    waiting.join(timeout=30.0)
    assert len(got) == 1 and torch.equal(got[0][0], layer(1.0)[0])
    feed.put(0, *layer(0.0))
    feed.put(2, *layer(2.0))
    assert [float(k[0, 0, 0]) for k, _ in feed] == [0.0, 1.0, 2.0]
    assert torch.equal(feed[-1][1], layer(2.0)[1])
    with pytest.raises(IndexError, match="layer 3"):
        feed[LAYERS]


def test_a_failed_read_or_a_late_layer_raises_prefix_load_failed() -> None:
    feed = LayerFeed(LAYERS, TOKENS, timeout_seconds=0.01)
    feed.put(0, *layer(0.0))
    with pytest.raises(PrefixLoadFailed, match="did not arrive"):
        feed[1]
    feed.fail(OSError("the arena went away"))
    with pytest.raises(PrefixLoadFailed, match="arena went away"):
        feed[2]
    assert torch.equal(feed[0][0], layer(0.0)[0])  # what arrived stays readable


def test_a_layer_of_another_token_count_is_refused() -> None:
    feed = LayerFeed(LAYERS, TOKENS, timeout_seconds=1.0)
    k, v = layer(0.0)
    with pytest.raises(ValueError, match="not \\[kv_heads, 4, head_dim\\]"):
        feed.put(0, k[:, :3], v[:, :3])


def test_a_module_served_whole_is_written_from_its_read_without_a_copy() -> None:
    """ModulePrefix hands the engine the read's own tensors when one span covers the cached
    part (a 4,096-token SmolLM2 module: 188 MB not copied a turn), and their concatenation
    in slot order otherwise."""
    feed = LayerFeed(LAYERS, TOKENS, timeout_seconds=1.0)
    for index in range(LAYERS):
        feed.put(index, *layer(float(index)))
    module = ModuleKV(tuple(range(TOKENS)), tuple(range(TOKENS)), feed)
    whole = CachedPiece.whole(module, 0)
    prefix = ModulePrefix([CachedSpan(whole, 0, TOKENS)], TOKENS, LAYERS, None, torch.device("cpu"))
    k, v = prefix.wait_layer(1, 1.0)
    assert k.data_ptr() == feed[1][0].data_ptr() and v.data_ptr() == feed[1][1].data_ptr()

    spans = [CachedSpan(whole, 0, 1), CachedSpan(whole, 2, TOKENS)]  # token 1 computed (repaired)
    k, v = ModulePrefix(spans, TOKENS - 1, LAYERS, None, torch.device("cpu")).wait_layer(2, 1.0)
    assert torch.equal(k, torch.cat([feed[2][0][:, :1], feed[2][0][:, 2:]], dim=1))
    assert torch.equal(v, torch.cat([feed[2][1][:, :1], feed[2][1][:, 2:]], dim=1))
