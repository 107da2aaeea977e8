"""The distributed forward against transformers' own: a sequence whose KV is split at
random into segments (prefilled segment by segment, in chunks, each chunk attending every
earlier segment and itself), then decoded into a tail segment, gives at every step the
logits of a plain forward over the whole sequence (1e-4, fp32): Llama with grouped query
heads, Qwen2, and Mistral with a sliding window shorter than the context."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, MistralConfig, PreTrainedModel

from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.dist_attention.segment import LocalSegment

TOLERANCE = 1e-4
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 256, "initializer_range": 0.2}  # fmt: skip


@pytest.fixture(scope="module")
def models(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path]
) -> dict[str, PreTrainedModel]:
    loaded = {}
    for family in ("llama", "qwen2"):
        path = tiny_model_saver(tmp_path_factory.mktemp(family), family, **SHAPE)
        loaded[family] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(0)
    loaded["mistral"] = AutoModelForCausalLM.from_config(
        MistralConfig(**SHAPE, sliding_window=24), dtype=torch.float32
    ).eval()
    return loaded


def reference(model: PreTrainedModel, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].float()  # [n, vocab]


def run_split(
    runner: DistributedRunner, tokens: list[int], cuts: list[int], chunk: int, steps: int
) -> list[tuple[int, torch.Tensor]]:
    """Prefills `tokens` into segments split at `cuts`, then decodes `steps` greedy tokens
    into a tail segment; (position, logits) of each segment's end and each decoded token."""
    places: list[LocalSegment] = []
    seen = []
    for start, stop in zip([0, *cuts], [*cuts, len(tokens)], strict=True):
        segment = runner.new_segment(start, 1)  # grows as it fills
        for begin in range(start, stop, chunk):
            end = min(begin + chunk, stop)
            logits = runner.forward(tokens[begin:end], begin, [*places, segment], segment)
        places.append(segment)
        seen.append((stop - 1, logits))
    tail = runner.new_segment(len(tokens), steps)
    for _ in range(steps):
        tokens.append(int(torch.argmax(seen[-1][1])))
        seen.append((len(tokens) - 1, runner.forward(tokens[-1:], len(tokens) - 1, [*places, tail], tail)))
    return seen


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    family=st.sampled_from(["llama", "qwen2", "mistral"]),
    length=st.integers(2, 60),
    cut_fractions=st.lists(st.floats(0.01, 0.99), max_size=5),
    chunk=st.integers(1, 16),
    seed=st.integers(0, 1000),
)
def test_any_split_gives_the_single_node_logits(
    models: dict[str, PreTrainedModel],
    family: str,
    length: int,
    cut_fractions: list[float],
    chunk: int,
    seed: int,
) -> None:
    model = models[family]
    tokens = torch.randint(0, 300, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    cuts = sorted({max(1, min(length - 1, int(f * length))) for f in cut_fractions} - {0, length})
    runner = DistributedRunner(model)
    seen = run_split(runner, tokens, cuts, chunk, steps=3)
    expected = reference(model, tokens)
    for position, logits in seen:
        assert (logits - expected[position]).abs().max() <= TOLERANCE, (family, position, cuts)
    runner.close()


def test_long_context_random_weight_llama(tiny_model_saver: Callable[..., Path], tmp_path: Path) -> None:
    """2k positions in four segments of KV, decoding past them, against the plain forward."""
    path = tiny_model_saver(tmp_path, "llama", **{**SHAPE, "max_position_embeddings": 4096})
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokens = torch.randint(0, 300, (2000,), generator=torch.Generator().manual_seed(3)).tolist()
    runner = DistributedRunner(model)
    seen = run_split(runner, tokens, [512, 1024, 1536], chunk=256, steps=2)
    expected = reference(model, tokens)
    assert max((logits - expected[p]).abs().max().item() for p, logits in seen) <= TOLERANCE
