"""The one adapter from the scheduler's turn events to what the OpenAI API reports: text
deltas with the stop texts cut off, then the finish reason and usage.

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
class Ending:
    """The last event of an answer."""

    finish_reason: FinishReason
    usage: Usage


async def answer_events(events: AsyncIterator[TurnEvent], stop: Sequence[str]) -> AsyncIterator[str | Ending]:
    """Non-empty text deltas of the answer, then one Ending."""
    held = ""
    keep = max((len(text) for text in stop), default=1) - 1
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, TurnOutcome):
                cut = min((held.find(text) for text in stop if text in held), default=len(held))
                if cut:
                    yield held[:cut]
                stop_text = cut < len(held)
                length = event.stats.finish_reason is TurnFinish.LENGTH and not stop_text
                yield Ending("length" if length else "stop", usage_of(event.stats))
                return
            held += event.text
            if any(text in held for text in stop):
                continue  # the turn ends with this token: the outcome comes next
            if len(held) > keep:
                yield held[: len(held) - keep]
                held = held[len(held) - keep :]


def usage_of(stats: WorkerStats) -> Usage:
    return Usage(
        prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.generated_tokens,
        total_tokens=stats.prompt_tokens + stats.generated_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=stats.reused_tokens),
    )
