"""Keys stored for positions [0, n) and rotated by d equal keys computed at [d, d + n)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

from inference_worker.rotary_shift import PositionShiftUnsupported, RotaryShift

TOKENS = 24
# Relative to the keys' magnitude (about 5 here). The model computes each angle as
# position * inv_freq in fp32, so the reference itself carries an angle error of up to half
# an ulp of the angle: 1.5e-5 rad at position 324, about 2e-5 on these keys.
TOLERANCE = 1e-5
ROPE_VARIANTS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 10000.0,
    },
    # yarn scales cos/sin by an attention factor (here about 1.14): a shift must not apply it twice.
    "yarn": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "rope_theta": 10000.0,
    },
}


@torch.no_grad()
def keys_at(model, ids: torch.Tensor, start: int) -> list[torch.Tensor]:
    """Every layer's keys [kv_heads, tokens, head_dim] for `ids` placed at positions start, start + 1, ..."""
    cache = DynamicCache()
    position_ids = torch.arange(start, start + ids.shape[1]).unsqueeze(0)  # [1, tokens]
    model(input_ids=ids, position_ids=position_ids, cache=cache, use_cache=True)
    return [layer.keys[0] for layer in cache.layers]


def token_ids(vocab_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(2)
    return torch.randint(0, vocab_size, (1, TOKENS), generator=generator)  # [1, tokens]


@pytest.mark.parametrize("rope", ROPE_VARIANTS)
@pytest.mark.parametrize("delta", [37, 300])
def test_shifted_keys_equal_keys_computed_at_the_new_positions(tiny_llama_factory, rope, delta):
    model = tiny_llama_factory(rope_parameters=ROPE_VARIANTS[rope])
    ids = token_ids(model.config.vocab_size)
    at_zero, at_delta = keys_at(model, ids, 0), keys_at(model, ids, delta)
    shift = RotaryShift(model)

    for layer, (k0, kd) in enumerate(zip(at_zero, at_delta, strict=True)):
        scale = kd.abs().max().item()
        forward = (shift.shift_keys(k0, delta) - kd).abs().max().item()
        back = (shift.shift_keys(kd, -delta) - k0).abs().max().item()
        assert max(forward, back) <= TOLERANCE * scale, f"layer {layer}: {forward=} {back=}"
    assert (at_zero[0] - at_delta[0]).abs().max().item() > 0.1  # the shift is not vacuous


def test_shifts_compose_and_zero_is_free(tiny_llama):
    shift = RotaryShift(tiny_llama)
    generator = torch.Generator().manual_seed(3)
    keys = torch.randn(2, 8, shift.head_dim, generator=generator)  # [kv_heads, tokens, head_dim]
    assert shift.shift_keys(keys, 0) is keys
    twice = shift.shift_keys(shift.shift_keys(keys, 100), -60)
    assert (twice - shift.shift_keys(keys, 40)).abs().max().item() <= TOLERANCE * keys.abs().max().item()


def test_bf16_keys_stay_bf16(tiny_llama):
    ids = token_ids(tiny_llama.config.vocab_size)
    k0, kd = keys_at(tiny_llama, ids, 0)[1], keys_at(tiny_llama, ids, 50)[1]

    shifted = RotaryShift(tiny_llama).shift_keys(k0.to(torch.bfloat16), 50)

    assert shifted.dtype == torch.bfloat16
    assert (shifted.float() - kd).abs().max().item() <= 2**-7 * kd.abs().max().item() * 2


def test_models_without_rotary_encoding_are_refused():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64))
    with pytest.raises(PositionShiftUnsupported, match="'gpt2' has no rotary"):
        RotaryShift(gpt2)


def test_length_dependent_rope_is_refused(tiny_llama_factory):
    model = tiny_llama_factory(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(PositionShiftUnsupported, match="'dynamic'"):
        RotaryShift(model)
