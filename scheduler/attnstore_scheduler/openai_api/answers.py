"""The one adapter from the scheduler's turn events to what the OpenAI API reports: text
deltas with the stop texts cut off, then the finish reasons (one per choice: `n`) and usage.

The worker ends a turn on the token that completes a stop text and streams that text
too; OpenAI's API leaves it out of the answer. So deltas are held back by the longest
stop text but one character (what could be the start of one) and the held text is cut at
the stop when the turn ends. Without stop texts nothing is held back.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from attnstore_scheduler.openai_api.models import FinishReason, PromptTokensDetails, Usage
from attnstore_scheduler.turn_types import FinishReason as TurnFinish
from attnstore_scheduler.turn_types import TurnOutcome, WorkerStats
from attnstore_scheduler.turns import TurnEvent


@dataclass(frozen=True)
class Text:
    """A delta of answer `index` (OpenAI's choice index; 0 unless the request asked n > 1)."""

    text: str
    index: int = 0


@dataclass(frozen=True)
class Ending:
    """The last event of an answer: each choice's finish reason, in index order."""

    finish_reasons: tuple[FinishReason, ...]
    usage: Usage

    @property
    def finish_reason(self) -> FinishReason:
        return self.finish_reasons[0]


async def answer_events(
    events: AsyncIterator[TurnEvent], stop: Sequence[str]
) -> AsyncIterator[Text | Ending]:
    """Non-empty text deltas of each answer (the answers' deltas interleave), then one
    Ending once every answer ended."""
    held: dict[int, str] = {}  # per answer
    keep = max((len(text) for text in stop), default=1) - 1
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, TurnOutcome):
                reasons: list[FinishReason] = []
                for index, sample in enumerate(event.stats.samples):
                    text = held.get(index, "")
                    cut = min(
                        (text.find(stop_text) for stop_text in stop if stop_text in text), default=len(text)
                    )
                    if cut:
                        yield Text(text[:cut], index)
                    length = sample.finish_reason is TurnFinish.LENGTH and cut == len(text)
                    reasons.append("length" if length else "stop")
                yield Ending(tuple(reasons), usage_of(event.stats))
                return
            text = held.get(event.sample, "") + event.text
            held[event.sample] = text
            if any(stop_text in text for stop_text in stop):
                continue  # this answer ends with this token
            if len(text) > keep:
                yield Text(text[: len(text) - keep], event.sample)
                held[event.sample] = text[len(text) - keep :]


def usage_of(stats: WorkerStats) -> Usage:
    return Usage(
        prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.generated_tokens,
        total_tokens=stats.prompt_tokens + stats.generated_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=stats.reused_tokens),
    )
