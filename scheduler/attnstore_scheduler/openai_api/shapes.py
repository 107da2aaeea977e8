"""How an answer is shaped for each endpoint: whole (a chat.completion or text_completion
object) or as stream chunks (chat.completion.chunk or text_completion objects)."""

from __future__ import annotations

import time
from typing import Protocol

from pydantic import BaseModel

from attnstore_scheduler.openai_api.answers import Ending
from attnstore_scheduler.openai_api.models import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChoice,
    Delta,
    response_id,
)


class Shape(Protocol):
    def whole(self, text: str, ending: Ending) -> BaseModel: ...

    def opening(self) -> list[BaseModel]:
        """Chunks sent before the first text."""

    def chunks(self, item: str | Ending, include_usage: bool) -> list[BaseModel]: ...


class ChatShape:
    def __init__(self, model: str) -> None:
        self._fields = {"id": response_id("chatcmpl"), "model": model, "created": int(time.time())}

    def whole(self, text: str, ending: Ending) -> ChatCompletion:
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=ending.finish_reason)
        return ChatCompletion(**self._fields, choices=[choice], usage=ending.usage)

    def opening(self) -> list[BaseModel]:
        return [self._chunk(ChatChunkChoice(delta=Delta(role="assistant", content="")))]

    def chunks(self, item: str | Ending, include_usage: bool) -> list[BaseModel]:
        if isinstance(item, str):
            return [self._chunk(ChatChunkChoice(delta=Delta(content=item)))]
        last = [self._chunk(ChatChunkChoice(delta=Delta(), finish_reason=item.finish_reason))]
        if include_usage:
            last.append(ChatCompletionChunk(**self._fields, choices=[], usage=item.usage))
        return last

    def _chunk(self, choice: ChatChunkChoice) -> ChatCompletionChunk:
        return ChatCompletionChunk(**self._fields, choices=[choice])


class CompletionShape:
    def __init__(self, model: str) -> None:
        self._fields = {"id": response_id("cmpl"), "model": model, "created": int(time.time())}

    def whole(self, text: str, ending: Ending) -> Completion:
        choice = CompletionChoice(text=text, finish_reason=ending.finish_reason)
        return Completion(**self._fields, choices=[choice], usage=ending.usage)

    def opening(self) -> list[BaseModel]:
        return []

    def chunks(self, item: str | Ending, include_usage: bool) -> list[BaseModel]:
        if isinstance(item, str):
            return [Completion(**self._fields, choices=[CompletionChoice(text=item)])]
        choice = CompletionChoice(text="", finish_reason=item.finish_reason)
        last: list[BaseModel] = [Completion(**self._fields, choices=[choice])]
        if include_usage:
            last.append(Completion(**self._fields, choices=[], usage=item.usage))
        return last
