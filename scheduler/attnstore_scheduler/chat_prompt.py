"""How a session's tokens are built (docs/scheduler.md, "How a session's tokens are built").

A session's history is the rendering of its conversation under the model's chat template,
except inside the answers: there it holds the ids the model generated, never re-tokenized
(the KV the worker saved is theirs, and decoding then encoding an answer does not always
give the same ids). After each answer comes the template's closing of an assistant
message (`<|im_end|>\\n` in ChatML) minus what the generation produced itself (the
end-of-turn token it stopped on), so an answer cut at max_tokens still reads as a closed
message. No worker runs the closing when the turn ends: the next turn prefills it with its
new message, one or two tokens more in a prefill that runs anyway, where running them at
once would cost a forward pass and a save for a session that may never come back.

Everything is derived by rendering, for any template: the worker renders messages and
returns the ids that follow a given message's content (Tokenize.after_contents). The
closing is that of [question, answer]; the next turn's prompt is the history, then the
rendering of [last question, last answer, new message] after the answer's content minus
the closing the history already holds. Rendering the last exchange rather than the whole
conversation keeps each call small however long the session, and starts with a user
message, as templates that check that roles alternate want. A template whose rendering of
the history changes when a message follows gets the whole conversation rendered anew
(correct, but that turn reuses only the common prefix), as do sessions stored before
answers were closed (closing_tokens None), once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from attnstore_scheduler.session_record import Message, SessionRecord
from attnstore_scheduler.turn_types import FinishReason
from attnstore_scheduler.worker_registry import WorkerHandle

# The answer is not known before the turn, and its closing is markup: any text stands in
# (not an empty one, which a template may leave out).
_ANSWER_STAND_IN = "answer"


@dataclass(frozen=True)
class ChatPrompt:
    token_ids: list[int]
    history_tokens: int  # leading ids that earlier turns ran (their KV may be stored); 0 = none
    answer_closing: list[int]  # the template's closing of the answer this prompt asks for


async def chat_prompt(worker: WorkerHandle, record: SessionRecord, message: str) -> ChatPrompt:
    """The prompt of a turn that adds `message` to the session (see the module doc)."""
    question = Message("user", message)
    closing = answer_closing(worker, question)
    conversation = (*record.messages, question)
    ran = record.token_ids[: len(record.token_ids) - (record.closing_tokens or 0)]
    if record.token_ids and record.closing_tokens is not None:
        closing_ids, extended = await asyncio.gather(closing, _extend_history(worker, record, question))
        if extended is not None:
            return ChatPrompt(extended, len(ran), closing_ids)
        ids = await tokenize(worker, conversation, add_generation_prompt=True)
    else:
        closing_ids, ids = await asyncio.gather(
            closing, tokenize(worker, conversation, add_generation_prompt=True)
        )
    return ChatPrompt(ids, len(ran) if tuple(ids[: len(ran)]) == ran else 0, closing_ids)


def answer_closing(worker: WorkerHandle, question: Message) -> Awaitable[list[int]]:
    """The template's closing of the answer to `question`."""
    return tokenize(
        worker,
        (question, Message("assistant", _ANSWER_STAND_IN)),
        add_generation_prompt=False,
        after_contents=2,
    )


async def _extend_history(worker: WorkerHandle, record: SessionRecord, question: Message) -> list[int] | None:
    """The history, then what the template writes after the last answer's content minus the
    closing the history holds; None when the template's rendering does not start so."""
    exchange = record.messages[-2:]  # the last question and its answer
    answered = len(exchange)
    history_closing, with_new = await asyncio.gather(
        tokenize(worker, exchange, add_generation_prompt=False, after_contents=answered),
        tokenize(worker, (*exchange, question), add_generation_prompt=True, after_contents=answered),
    )
    if with_new[: len(history_closing)] != history_closing:
        return None
    return [*record.token_ids, *with_new[len(history_closing) :]]


def closing_after(generated: Sequence[int], closing: Sequence[int], finish_reason: FinishReason) -> list[int]:
    """What of the template's `closing` follows an answer's `generated` ids: after a stop
    token the closing starts with (ChatML's `<|im_end|>`), or holds further on, the rest of
    the closing after it; after an answer cut at max_tokens or by a stop text, or a stop
    token the closing lacks, all of it."""
    if finish_reason is FinishReason.STOP and generated and generated[-1] in closing:
        return list(closing[closing.index(generated[-1]) + 1 :])
    return list(closing)


async def tokenize(
    worker: WorkerHandle,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool,
    after_contents: int = 0,
) -> list[int]:
    return await worker.client.tokenize(
        tuple((message.role, message.content) for message in messages),
        add_generation_prompt=add_generation_prompt,
        after_contents=after_contents,
    )
