"""The HTTP routes: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics.

A chat request without `X-Attnstore-Session` is stateless: its messages are the prompt
(the worker applies the chat template), and the KV of its prompt's full chunks is found
by their chunk keys, so a client that resends a conversation reuses the KV of the
earlier requests as far as their tokens agree. With the header the request is a turn of
a stored session (`_session_turn` has the rule), whose history's token ids (generated
ones included) are reused exactly, as gRPC Chat does.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import structlog
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from attnstore import errors
from attnstore_scheduler.openai_api.answers import Ending, Text, answer_events
from attnstore_scheduler.openai_api.context import ApiContext
from attnstore_scheduler.openai_api.errors import ApiError, from_service_error
from attnstore_scheduler.openai_api.models import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    ModelCard,
    ModelList,
)
from attnstore_scheduler.openai_api.shapes import ChatShape, CompletionShape, Shape
from attnstore_scheduler.openai_api.streaming import (
    DONE,
    ClientGone,
    counting_disconnects,
    event,
    until_disconnected,
)
from attnstore_scheduler.session_record import check_session_id
from attnstore_scheduler.turn_types import GenerationOptions
from attnstore_scheduler.validation import check_text, require_model, sampling

log = structlog.get_logger("attnstore_scheduler.openai_api")

SESSION_HEADER = "X-Attnstore-Session"
NEW_SESSION = "new"
# Stateless requests whose first message (or prompt start) agrees go to the same node.
_AFFINITY_CHARS = 1024
_CLIENT_CLOSED_REQUEST = 499  # nobody reads it: the client is gone


def build_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    caller = Depends(ctx.tenant)

    @router.get("/v1/models")
    async def list_models(tenant: str = caller) -> ModelList:
        return ModelList(data=[ModelCard(id=ctx.model_name())])

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, tenant: str = caller) -> ModelCard:
        return ModelCard(id=ctx.check_model(model_id))

    @router.post("/v1/chat/completions")
    async def chat_completions(
        body: ChatCompletionRequest, request: Request, tenant: str = caller
    ) -> Response:
        model = ctx.check_model(body.model)
        messages = [message.pair() for message in body.messages]
        header = request.headers.get(SESSION_HEADER)
        if header is None:
            for index, (_, content) in enumerate(messages):
                check_text(content, f"messages[{index}].content", ctx.limits, required=False)
            affinity = messages[0][1][:_AFFINITY_CHARS]
            events = ctx.turns.complete(
                tenant, messages, options_of(body), affinity=affinity, kind="openai_chat"
            )
            headers = {}
        else:
            options = options_of(body)
            session_id, message = await _session_turn(ctx, tenant, header, messages, options)
            events = ctx.turns.chat(tenant, session_id, message, options)
            headers = {SESSION_HEADER: session_id}
        answer = answer_events(events, body.stop_texts())
        return await _respond(request, answer, ChatShape(model, body.n), body, headers)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request, tenant: str = caller) -> Response:
        model = ctx.check_model(body.model)
        prompt = check_text(body.prompt_text(), "prompt", ctx.limits, required=True)
        events = ctx.turns.complete(
            tenant, prompt, options_of(body), affinity=prompt[:_AFFINITY_CHARS], kind="openai_completion"
        )
        answer = answer_events(events, body.stop_texts())
        return await _respond(request, answer, CompletionShape(model), body, {})

    @router.get("/health")
    async def health() -> dict[str, str]:
        """200 when the session store answers and a worker is registered, else 503."""
        try:
            await ctx.sessions.store.ping()
        except Exception as exc:  # any failure means "not serving"
            raise ApiError(
                503, f"the session store does not answer: {exc!r}", "server_error", "unavailable"
            ) from exc
        return {"status": "ok", "model": ctx.model_name()}

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return router


def options_of(body: GenerationRequest) -> GenerationOptions:
    """The request's sampling as the scheduler's options (checked by validation.sampling)."""
    return GenerationOptions(
        max_tokens=body.token_limit or 0,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=tuple(body.stop_texts()),
        n=body.n,
    )


async def _session_turn(
    ctx: ApiContext,
    tenant: str,
    header: str,
    messages: Sequence[tuple[str, str]],
    options: GenerationOptions,
) -> tuple[str, str]:
    """(session id, new message) of a request with X-Attnstore-Session. The last message is
    the new one and must be a user message; the session's stored history stands for all
    the earlier ones (which are not read: resending them is allowed and costs nothing).
    `new` starts a session: then the messages are [system (optional), user], the system
    message becomes the session's system prompt, and the reply's header names the session."""
    role, message = messages[-1]
    if role != "user":
        raise ApiError(
            400,
            f"with {SESSION_HEADER} the last message must be the new user message, not {role!r}",
            "invalid_request_error",
            "invalid_value",
            param="messages",
        )
    message = check_text(message, "the last message's content", ctx.limits, required=True)
    if header != NEW_SESSION:
        return check_session_id(header, SESSION_HEADER), message
    earlier = messages[:-1]
    if len(earlier) > 1 or (earlier and earlier[0][0] != "system"):
        raise ApiError(
            400,
            f"{SESSION_HEADER}: {NEW_SESSION} starts a conversation: send a system message (optional) and "
            "one user message; continue it with the session id this reply's header names",
            "invalid_request_error",
            "invalid_value",
            param="messages",
        )
    system_prompt = check_text(earlier[0][1] if earlier else "", "system message", ctx.limits, required=False)
    # Refused before a session exists.
    sampling(options, ctx.limits, require_model(ctx.registry.model()), session=True)
    record = await ctx.sessions.create(tenant, system_prompt, ctx.limits.session_ttl_seconds)
    return record.session_id, message


async def _respond(
    request: Request,
    answer: AsyncIterator[Text | Ending],
    shape: Shape,
    body: GenerationRequest,
    headers: dict[str, str],
) -> Response:
    """The whole answer as JSON, or a stream of server-sent events. Errors before the first
    token are HTTP errors; a stream that fails later ends with an `error` event."""
    try:
        if not body.stream:
            texts, ending = await until_disconnected(request, _collect(answer))
            return JSONResponse(shape.whole(texts, ending).model_dump(mode="json"), headers=headers)
        first = await until_disconnected(request, anext(answer))
    except ClientGone:
        await answer.aclose()
        return Response(status_code=_CLIENT_CLOSED_REQUEST)
    frames = _frames(first, answer, shape, body.include_usage)
    return StreamingResponse(counting_disconnects(frames), media_type="text/event-stream", headers=headers)


async def _collect(answer: AsyncIterator[Text | Ending]) -> tuple[list[str], Ending]:
    """Each choice's whole text, and the ending."""
    parts: dict[int, list[str]] = {}
    async for item in answer:
        if isinstance(item, Ending):
            return ["".join(parts.get(index, ())) for index in range(len(item.finish_reasons))], item
        parts.setdefault(item.index, []).append(item.text)
    raise errors.Unavailable("the turn ended without its outcome")


async def _frames(
    first: Text | Ending, answer: AsyncIterator[Text | Ending], shape: Shape, include_usage: bool
) -> AsyncIterator[str]:
    async with contextlib.aclosing(answer):
        for chunk in shape.opening():
            yield event(chunk)
        item = first
        try:
            while True:
                for chunk in shape.chunks(item, include_usage):
                    yield event(chunk)
                if isinstance(item, Ending):
                    break
                item = await anext(answer)
        except errors.ServiceError as exc:
            log.warning("stream_failed", error=str(exc))
            yield event(from_service_error(exc))
            return
    yield DONE
