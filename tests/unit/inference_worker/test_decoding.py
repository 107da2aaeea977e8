"""Token choice: greedy, temperature and top-p sampling from a seeded generator."""

from __future__ import annotations

import math

import pytest
import torch

from attnstore.errors import InvalidArgument
from inference_worker.decoding import Sampler, check_sampling, completes_stop_string
from inference_worker.turn_types import SamplingParams

# probabilities 0.5, 0.3, 0.15, 0.05 over four tokens
LOGITS = torch.tensor([math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)])


def draws(params: SamplingParams, count: int = 2000) -> torch.Tensor:
    sampler = Sampler(params)
    return torch.tensor([sampler(LOGITS) for _ in range(count)])


def test_greedy_takes_the_argmax() -> None:
    assert Sampler(SamplingParams())(LOGITS.flip(0)) == 3


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    # 0.5 + 0.3 = 0.8 >= 0.7: tokens 0 and 1 only, in proportion 5:3.
    picked = draws(SamplingParams(temperature=1.0, top_p=0.7, seed=0))
    assert set(picked.tolist()) == {0, 1}
    assert (picked == 0).float().mean().item() == pytest.approx(5 / 8, abs=0.05)


def test_temperature_one_follows_the_distribution() -> None:
    picked = draws(SamplingParams(temperature=1.0, seed=1))
    frequencies = torch.bincount(picked, minlength=4).float() / len(picked)
    assert torch.allclose(frequencies, LOGITS.exp(), atol=0.04)


def test_a_seed_fixes_the_draws() -> None:
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=42)
    assert torch.equal(draws(params, 50), draws(params, 50))


@pytest.mark.parametrize("temperature", [1e-45, 1e-30, 1e-8])
@pytest.mark.parametrize("top_p", [1.0, 0.5])
def test_a_tiny_temperature_samples_the_argmax(temperature: float, top_p: float) -> None:
    """logits / 1e-45 overflow float32: the sampler must not hand NaN to multinomial."""
    params = SamplingParams(temperature=temperature, top_p=top_p, seed=3)
    assert set(draws(params, 20).tolist()) == {0}


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=0),
        SamplingParams(temperature=-0.1),
        SamplingParams(top_p=0.0),
        SamplingParams(top_p=1.5),
    ],
)
def test_impossible_parameters_are_refused(params: SamplingParams) -> None:
    with pytest.raises(InvalidArgument):
        check_sampling(params)


@pytest.mark.parametrize(
    ("before", "added", "expected"),
    [
        ("the answer", " is END", True),  # within the new text
        ("the answer E", "ND here", True),  # across the previous text and the new one
        ("ENDED before", " and on", False),  # only a stop the new text completes counts
        ("the answer", "", False),
        ("x", "\n", True),  # one-character stops
    ],
)
def test_a_stop_string_ends_the_turn_on_the_token_that_completes_it(
    before: str, added: str, expected: bool
) -> None:
    assert completes_stop_string(before, added, ("END", "\n")) is expected
