"""The turn engine without a store, on the tiny model: its decoding loop against
transformers' own `generate`, stop tokens, seeded sampling, a prompt longer than the
context window, and turns and settings it refuses."""

from __future__ import annotations

import pytest
import torch

from attnstore.errors import InvalidArgument
from inference_worker.model_store import LoadedModel
from inference_worker.settings import WorkerSettings
from inference_worker.truncation import ContextWindowError
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import SamplingParams, TokenEvent, TurnInput, TurnStats

pytestmark = pytest.mark.timeout(60)

PROMPT = torch.randint(0, 256, (37,), generator=torch.Generator().manual_seed(3)).tolist()


async def run(engine: TurnEngine, turn: TurnInput) -> tuple[list[TokenEvent], TurnStats]:
    events = [event async for event in engine.run_turn(turn, None)]
    stats = events.pop()
    assert isinstance(stats, TurnStats) and all(isinstance(e, TokenEvent) for e in events)
    return events, stats  # type: ignore[return-value]


async def test_greedy_turn_matches_generate(tiny_model: LoadedModel) -> None:
    engine = TurnEngine(tiny_model, None, WorkerSettings())
    events, stats = await run(engine, TurnInput(PROMPT, SamplingParams(max_tokens=24)))
    with torch.no_grad():
        ids = torch.tensor([PROMPT])  # [1, T]
        generated = tiny_model.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, pad_token_id=0
        )
    expected = generated[0, len(PROMPT) :].tolist()
    assert [e.token_id for e in events] == expected
    assert "".join(e.text for e in events) == tiny_model.tokenizer.decode(expected, skip_special_tokens=True)
    assert stats.finish_reason == "length" and stats.generated_tokens == 24
    assert stats.reused_tokens == stats.saved_chunks == 0 and stats.fallback is None
    assert 0 < stats.compute_seconds <= stats.ttft_seconds


async def test_stop_token_ends_the_turn(tiny_model: LoadedModel) -> None:
    engine = TurnEngine(tiny_model, None, WorkerSettings())
    events, _ = await run(engine, TurnInput(PROMPT, SamplingParams(max_tokens=24)))
    stop = events[5].token_id
    first = next(i for i, e in enumerate(events) if e.token_id == stop)
    stopped, stats = await run(
        engine, TurnInput(PROMPT, SamplingParams(max_tokens=24, stop_token_ids=(stop,)))
    )
    assert [e.token_id for e in stopped] == [e.token_id for e in events[: first + 1]]
    assert stats.finish_reason == "stop"


async def test_seeded_sampling_is_reproducible(tiny_model: LoadedModel) -> None:
    engine = TurnEngine(tiny_model, None, WorkerSettings())

    async def sample(seed: int, top_p: float = 0.9) -> list[int]:
        params = SamplingParams(max_tokens=16, temperature=1.5, top_p=top_p, seed=seed)
        events, _ = await run(engine, TurnInput(PROMPT, params))
        return [e.token_id for e in events]

    assert await sample(7) == await sample(7)
    assert await sample(7) != await sample(8)
    greedy, _ = await run(engine, TurnInput(PROMPT, SamplingParams(max_tokens=16)))
    assert await sample(7, top_p=1e-6) == [e.token_id for e in greedy]  # only the top token survives


@pytest.mark.parametrize(
    ("turn", "message"),
    [
        (TurnInput([]), "no tokens"),
        (TurnInput(PROMPT, truncated_tokens=64), "truncated_tokens is 64, but a prompt of 37 tokens"),
        (TurnInput([1] * 1024, SamplingParams(max_tokens=1000)), "does not fit the 1024-token context"),
        (TurnInput(PROMPT, SamplingParams(max_tokens=0)), "max_tokens"),
        (TurnInput(PROMPT, SamplingParams(top_p=0.0)), "top_p"),
        (TurnInput(PROMPT, SamplingParams(temperature=-1.0)), "temperature"),
        (TurnInput([1, 300]), "token ids"),
    ],
)
async def test_refused_turns(tiny_model: LoadedModel, turn: TurnInput, message: str) -> None:
    engine = TurnEngine(tiny_model, None, WorkerSettings())
    with pytest.raises(InvalidArgument, match=message):
        await run(engine, turn)


async def test_a_prompt_longer_than_the_window_runs_truncated(tiny_model: LoadedModel) -> None:
    engine = TurnEngine(
        tiny_model, None, WorkerSettings(chunk_tokens=16, max_context_tokens=64, attention_sink_tokens=4)
    )
    prompt = torch.randint(0, 256, (100,), generator=torch.Generator().manual_seed(4)).tolist()
    events, stats = await run(engine, TurnInput(prompt, SamplingParams(max_tokens=8)))
    # 100 + 8 tokens in a 64-token window: 44 must go, so chunks 0 (but its 4 sinks) to 2 do.
    assert (stats.truncated_tokens, stats.sink_tokens) == (44, 4)
    kept = prompt[:4] + prompt[48:]
    reference, reference_stats = await run(engine, TurnInput(kept, SamplingParams(max_tokens=8)))
    assert [e.token_id for e in events] == [e.token_id for e in reference]
    assert reference_stats.truncated_tokens == 0 and stats.prompt_tokens == 100
    assert stats.namespace == b"" and stats.chunk_keys == ()  # no source, no keys


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_context_tokens": 2048}, "max_context_tokens is 2048, beyond the model's 1024 positions"),
        ({"attention_sink_tokens": 20, "chunk_tokens": 16}, "attention_sink_tokens is 20"),
        ({"max_context_tokens": 100, "chunk_tokens": 96}, "must exceed attention_sink_tokens"),
    ],
)
def test_bad_context_settings_are_refused(tiny_model: LoadedModel, settings: dict, message: str) -> None:
    with pytest.raises(ContextWindowError, match=message):
        TurnEngine(tiny_model, None, WorkerSettings(**settings))
