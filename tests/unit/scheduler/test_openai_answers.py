"""The OpenAI API's view of a turn (openai_api/answers.py): text deltas with the stop texts
cut off, held back no more than a stop text could need, then the finish reason and usage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from attnstore.worker.v1 import worker_pb2
from attnstore_scheduler.openai_api.answers import Ending, Text, answer_events
from attnstore_scheduler.turn_types import Token, TurnOutcome
from attnstore_scheduler.turns import TurnEvent
from attnstore_scheduler.worker_messages import worker_stats

STOP = worker_pb2.FINISH_REASON_STOP
LENGTH = worker_pb2.FINISH_REASON_LENGTH


async def turn(texts: Sequence[str], finish: int) -> AsyncIterator[TurnEvent]:
    for index, text in enumerate(texts):
        yield Token(index, text)
    stats = worker_pb2.TurnStats(
        prompt_tokens=40, reused_tokens=32, generated_tokens=len(texts), finish_reason=finish
    )
    yield TurnOutcome(worker_stats(stats), None, tuple(range(len(texts))), "".join(texts), "n", 1, 0.0)


def answer(texts: Sequence[str], stop: Sequence[str], finish: int = LENGTH) -> list[str | Ending]:
    async def collect() -> list[str | Ending]:
        return [
            item.text if isinstance(item, Text) else item
            async for item in answer_events(turn(texts, finish), stop)
        ]

    return asyncio.run(collect())


def test_without_stop_texts_every_delta_passes_at_once_and_usage_reports_reuse() -> None:
    *deltas, ending = answer(["he", "llo", "", " you"], stop=())
    assert deltas == ["he", "llo", " you"]  # an empty delta (a special token) is dropped
    assert isinstance(ending, Ending) and ending.finish_reason == "length"
    usage = ending.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (40, 4, 44)
    assert usage.prompt_tokens_details.cached_tokens == 32


@pytest.mark.parametrize(
    ("texts", "stop", "expected"),
    [
        (["the ", "cat", " sat", "##"], ["##"], "the cat sat"),  # the stop text as the last token
        (["the c", "at E", "ND"], ["END"], "the cat "),  # a stop text across tokens
        (["a", "b", "STOPc"], ["STOP", "b"], "a"),  # the first stop text in the answer wins
    ],
)
def test_a_stop_text_is_cut_off_and_finishes_with_stop(
    texts: list[str], stop: list[str], expected: str
) -> None:
    *deltas, ending = answer(texts, stop, finish=STOP)
    assert "".join(d for d in deltas if isinstance(d, str)) == expected
    assert isinstance(ending, Ending) and ending.finish_reason == "stop"


def test_text_is_held_back_only_as_long_as_it_may_start_a_stop_text() -> None:
    *deltas, ending = answer(["abcdef", "gh", "ij"], stop=["xyz"])
    # Two characters wait each time (a 3-character stop text could start there).
    assert deltas == ["abcd", "ef", "gh", "ij"]
    assert isinstance(ending, Ending) and ending.finish_reason == "length"


def test_each_of_n_answers_is_held_and_cut_on_its_own() -> None:
    async def two_answers() -> AsyncIterator[TurnEvent]:
        for sample, text in [(0, "ab"), (1, "xy"), (0, "c#"), (1, "zw"), (1, "v")]:
            yield Token(0, text, sample)
        samples = [
            worker_pb2.SampleStats(sample_index=0, generated_tokens=2, finish_reason=STOP),
            worker_pb2.SampleStats(sample_index=1, generated_tokens=3, finish_reason=LENGTH),
        ]
        stats = worker_pb2.TurnStats(prompt_tokens=4, generated_tokens=5, finish_reason=STOP, samples=samples)
        yield TurnOutcome(worker_stats(stats), None, (0, 0), "abc#", "n", 1, 0.0)

    async def collect() -> list[Text | Ending]:
        return [item async for item in answer_events(two_answers(), ["#"])]

    *deltas, ending = asyncio.run(collect())
    texts = ["".join(d.text for d in deltas if isinstance(d, Text) and d.index == i) for i in (0, 1)]
    assert texts == ["abc", "xyzwv"]  # answer 0 cut at its stop text, answer 1 whole
    assert isinstance(ending, Ending) and ending.finish_reasons == ("stop", "length")
    assert ending.usage.completion_tokens == 5  # over both answers
