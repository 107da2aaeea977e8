"""How an answer is shaped for each endpoint: whole (a chat.completion or text_completion
object) or as stream chunks (chat.completion.chunk or text_completion objects). With n
choices each chunk carries one choice, by its index, as OpenAI streams them."""

from __future__ import annotations

import time
from typing import Protocol

from pydantic import BaseModel

from attnstore_scheduler.openai_api.answers import Ending, Text
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
    def whole(self, texts: list[str], ending: Ending) -> BaseModel:
        """The whole answer: choice i holds texts[i]."""

    def opening(self) -> list[BaseModel]:
        """Chunks sent before the first text."""

    def chunks(self, item: Text | Ending, include_usage: bool) -> list[BaseModel]: ...


class ChatShape:
    def __init__(self, model: str, choices: int = 1) -> None:
        self._fields = {"id": response_id("chatcmpl"), "model": model, "created": int(time.time())}
        self._choices = choices

    def whole(self, texts: list[str], ending: Ending) -> ChatCompletion:
        choices = [
            ChatChoice(index=index, message=AssistantMessage(content=text), finish_reason=reason)
            for index, (text, reason) in enumerate(zip(texts, ending.finish_reasons, strict=True))
        ]
        return ChatCompletion(**self._fields, choices=choices, usage=ending.usage)

    def opening(self) -> list[BaseModel]:
        return [
            self._chunk(ChatChunkChoice(index=index, delta=Delta(role="assistant", content="")))
            for index in range(self._choices)
        ]

    def chunks(self, item: Text | Ending, include_usage: bool) -> list[BaseModel]:
        if isinstance(item, Text):
            return [self._chunk(ChatChunkChoice(index=item.index, delta=Delta(content=item.text)))]
        last: list[BaseModel] = [
            self._chunk(ChatChunkChoice(index=index, delta=Delta(), finish_reason=reason))
            for index, reason in enumerate(item.finish_reasons)
        ]
        if include_usage:
            last.append(ChatCompletionChunk(**self._fields, choices=[], usage=item.usage))
        return last

    def _chunk(self, choice: ChatChunkChoice) -> ChatCompletionChunk:
        return ChatCompletionChunk(**self._fields, choices=[choice])


class CompletionShape:
    def __init__(self, model: str) -> None:
        self._fields = {"id": response_id("cmpl"), "model": model, "created": int(time.time())}

    def whole(self, texts: list[str], ending: Ending) -> Completion:
        choices = [
            CompletionChoice(index=index, text=text, finish_reason=reason)
            for index, (text, reason) in enumerate(zip(texts, ending.finish_reasons, strict=True))
        ]
        return Completion(**self._fields, choices=choices, usage=ending.usage)

    def opening(self) -> list[BaseModel]:
        return []

    def chunks(self, item: Text | Ending, include_usage: bool) -> list[BaseModel]:
        if isinstance(item, Text):
            return [Completion(**self._fields, choices=[CompletionChoice(index=item.index, text=item.text)])]
        last: list[BaseModel] = [
            Completion(**self._fields, choices=[CompletionChoice(index=index, text="", finish_reason=reason)])
            for index, reason in enumerate(item.finish_reasons)
        ]
        if include_usage:
            last.append(Completion(**self._fields, choices=[], usage=item.usage))
        return last
