"""Request and response bodies of the OpenAI-compatible API (pydantic). Fields of OpenAI's
API that attnstore does not implement are ignored, except those whose silent omission
would change the answer (logprobs, tools, echo, suffix): those are refused. `n` answers
are drawn from one prefill (parallel sampling), up to the scheduler's max_samples."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from attnstore_scheduler.validation import MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_TEMPERATURE

_UINT64_MAX = 2**64 - 1
StopText = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=256)
    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE, description="absent: greedy")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=_UINT64_MAX)
    stop: StopText | list[StopText] | None = None
    n: int = Field(1, ge=1, description="choices; the bound is the scheduler's max_samples (validation.py)")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)  # accepted, unused

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop texts are allowed")
        return stop

    def stop_texts(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # "developer" is OpenAI's newer name for the system role.
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)

    def pair(self) -> tuple[str, str]:
        """(role, content) as the scheduler and the worker take them."""
        return ("system" if self.role == "developer" else self.role, self.text())


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="wins over max_tokens")
    logprobs: bool | None = None
    tools: list[object] | None = None

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        refuse_unsupported(logprobs=bool(self.logprobs), tools=bool(self.tools))
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(GenerationRequest):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    max_tokens: int | None = Field(None, ge=1)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None

    @model_validator(mode="after")
    def _supported(self) -> CompletionRequest:
        refuse_unsupported(echo=self.echo, suffix=bool(self.suffix), logprobs=self.logprobs is not None)
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose KV was reused


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


FinishReason = Literal["stop", "length"]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: None = None


class _Response(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    system_fingerprint: None = None


class ChatCompletion(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class Completion(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "attnstore"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def refuse_unsupported(**asked: bool) -> None:
    named = [name for name, used in asked.items() if used]
    if named:
        raise ValueError(f"{', '.join(named)} is not supported by attnstore's OpenAI-compatible API")


def response_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
