"""What both clients share: call metadata, request building, and collecting a streamed
answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attnstore.api.v1 import api_pb2 as api

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]

# A streamed turn: TokenText messages, then one TurnStats.
StreamEvent = api.TokenText | api.TurnStats


def call_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return () if api_key is None else (("authorization", f"Bearer {api_key}"),)


def options(
    max_tokens: int = 0,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    n: int = 0,
) -> api.GenerationOptions:
    """Generation options; None leaves a field to the server's default. `stop`: texts that
    end the answer (the streamed tokens include the one that matched). `n`: answers drawn
    from the prompt (Generate only; 0 = 1)."""
    message = api.GenerationOptions(max_tokens=max_tokens, stop=stop, n=n)
    if temperature is not None:
        message.temperature = temperature
    if top_p is not None:
        message.top_p = top_p
    if seed is not None:
        message.seed = seed
    return message


def event_of(reply: api.ChatResponse | api.GenerateResponse) -> StreamEvent:
    return reply.token if reply.WhichOneof("event") == "token" else reply.stats


@dataclass
class Answer:
    """A whole streamed answer (with GenerationOptions.n, answer 0; `samples` has each)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    stats: api.TurnStats | None = None  # set once the stream ended normally
    samples: dict[int, Answer] = field(default_factory=dict)  # by sample_index; answer 0 included

    def add(self, event: StreamEvent) -> None:
        if isinstance(event, api.TurnStats):
            self.stats = event
            return
        sample = self.samples.setdefault(event.sample_index, Answer())
        sample.text += event.text
        sample.token_ids.append(event.token_id)
        if event.sample_index == 0:
            self.text += event.text
            self.token_ids.append(event.token_id)


def page_request(page_size: int, page_token: str, tenant: str) -> api.ListSessionsRequest:
    return api.ListSessionsRequest(page_size=page_size, page_token=page_token, tenant=tenant)


def sessions_of(reply: api.ListSessionsResponse) -> tuple[list[api.Session], str]:
    return list(reply.sessions), reply.next_page_token


SchemaEvent = api.SchemaEncodeProgress | api.SchemaInfo


def schema_event_of(reply: api.RegisterSchemaResponse) -> SchemaEvent:
    """A module's encoding progress, or (last) the registered schema."""
    return reply.schema if reply.HasField("schema") else reply.progress


REPAIR_METHODS = {
    "": api.REPAIR_METHOD_UNSPECIFIED,
    "first": api.REPAIR_METHOD_FIRST,
    "deviation": api.REPAIR_METHOD_DEVIATION,
}


def repair_fields(
    repair_tokens: int = 0, repair_method: str = "", repair_fraction: float = 0.0
) -> dict[str, Any]:
    """Boundary repair of a PML prompt: `repair_tokens` per module or `repair_fraction` of
    each module's tokens; `repair_method` "first", "deviation" or "" (the worker's setting)."""
    if repair_method not in REPAIR_METHODS:
        raise ValueError(f"repair_method {repair_method!r} is none of {sorted(REPAIR_METHODS)}")
    return {
        "repair_tokens": repair_tokens,
        "repair_method": REPAIR_METHODS[repair_method],
        "repair_fraction": repair_fraction,
    }


def _repair_and_options(keywords: dict[str, Any]) -> dict[str, Any]:
    """A PML request's repair fields (repair_fields' keywords) and its generation options
    (options' keywords) from the SDK's keywords."""
    repair = {
        key: keywords.pop(key)
        for key in ("repair_tokens", "repair_method", "repair_fraction")
        if key in keywords
    }
    return repair_fields(**repair) | {"options": options(**keywords)}


def pml_request(
    pml: str, repair_tokens: int, add_generation_prompt: bool, **repair_and_generation: Any
) -> api.GenerateRequest:
    return api.GenerateRequest(
        pml=pml,
        add_generation_prompt=add_generation_prompt,
        **_repair_and_options({"repair_tokens": repair_tokens, **repair_and_generation}),
    )


def chat_request(
    session_id: str,
    message: str,
    *,
    pml: str = "",
    expected_next_turn_seconds: float = 0.0,
    conversation_over: bool = False,
    **repair_and_generation: Any,
) -> api.ChatRequest:
    """A Chat turn: `message`, or (the first turn of a session) a `pml` prompt with its
    repair keywords (repair_fields')."""
    return api.ChatRequest(
        session_id=session_id,
        message=message,
        pml=pml,
        expected_next_turn_seconds=expected_next_turn_seconds,
        conversation_over=conversation_over,
        **_repair_and_options(repair_and_generation),
    )
