"""The gRPC edge of the public API (attnstore.api.v1.AttnStore): authenticates the caller,
applies the tenant's rate limit, checks the request, and hands the work to Sessions and
Turns. Domain errors become statuses in the shared interceptor."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from attnstore.api.v1 import api_pb2 as api
from attnstore.api.v1 import api_pb2_grpc
from attnstore.errors import InvalidArgument
from attnstore.finish_reasons import finish_reason_to_proto, samples_to_proto
from attnstore.same_named import same_named
from attnstore_scheduler import metrics
from attnstore_scheduler.auth import Principal
from attnstore_scheduler.callers import Callers
from attnstore_scheduler.pml_requests import check_no_pml_options, pml_prompt
from attnstore_scheduler.schema_store import SchemaRecord
from attnstore_scheduler.schemas import Schemas
from attnstore_scheduler.session_record import Message, SessionRecord, check_session_id
from attnstore_scheduler.sessions import Sessions
from attnstore_scheduler.turn_types import GenerationOptions, TurnOutcome
from attnstore_scheduler.turns import TurnEvent, Turns
from attnstore_scheduler.validation import ApiLimits, check_expectation, check_page, check_text, check_ttl

SERVICE_NAME = api.DESCRIPTOR.services_by_name["AttnStore"].full_name

_ROLES = {"system": api.ROLE_SYSTEM, "user": api.ROLE_USER, "assistant": api.ROLE_ASSISTANT}


class AttnStoreServicer(api_pb2_grpc.AttnStoreServicer):
    def __init__(
        self,
        sessions: Sessions,
        turns: Turns,
        callers: Callers,
        limits: ApiLimits,
        schemas: Schemas,
    ) -> None:
        self._schemas = schemas
        self._sessions = sessions
        self._turns = turns
        self._callers = callers
        self._limits = limits

    def _caller(self, context: grpc.aio.ServicerContext) -> Principal:
        return self._callers.admit(context.invocation_metadata() or ())

    async def CreateSession(
        self, request: api.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> api.CreateSessionResponse:
        tenant = self._caller(context).tenant
        system_prompt = check_text(request.system_prompt, "system_prompt", self._limits, required=False)
        ttl_seconds = check_ttl(request.ttl_seconds, self._limits)
        if system_prompt:
            await self._turns.check_system_prompt(system_prompt)
        expectation = check_expectation(
            request.expected_next_turn_seconds, request.conversation_over, self._limits
        )
        record = await self._sessions.create(tenant, system_prompt, ttl_seconds)
        self._sessions.expect(tenant, record.session_id, expectation)
        return api.CreateSessionResponse(session=session_message(record, with_messages=True))

    async def Chat(
        self, request: api.ChatRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api.ChatResponse]:
        started = time.monotonic()
        tenant = self._caller(context).tenant
        session_id = check_session_id(request.session_id)
        expectation = check_expectation(
            request.expected_next_turn_seconds, request.conversation_over, self._limits
        )
        if request.pml:
            if request.message:
                raise InvalidArgument("give message or pml, not both")
            schema = await self._schemas.for_prompt(tenant, request.pml)
            prompt = pml_prompt(schema.document, request.pml, request, add_generation_prompt=True)
            events = self._turns.chat_pml(
                tenant, session_id, schema, prompt, options_of(request.options), expectation
            )
        else:
            check_no_pml_options(request)
            message = check_text(request.message, "message", self._limits, required=True)
            events = self._turns.chat(tenant, session_id, message, options_of(request.options), expectation)
        async for token, stats in _stream(events, started, "chat"):
            yield api.ChatResponse(token=token) if token is not None else api.ChatResponse(stats=stats)

    async def Generate(
        self, request: api.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api.GenerateResponse]:
        started = time.monotonic()
        tenant = self._caller(context).tenant
        if request.pml:
            if request.prompt or request.system_prompt:
                raise InvalidArgument("give pml, or prompt (and system_prompt), not both")
            schema = await self._schemas.for_prompt(tenant, request.pml)
            prompt = pml_prompt(
                schema.document, request.pml, request, add_generation_prompt=request.add_generation_prompt
            )
            events = self._turns.generate_pml(tenant, schema, prompt, options_of(request.options))
        else:
            check_no_pml_options(request, add_generation_prompt=request.add_generation_prompt)
            system_prompt = check_text(request.system_prompt, "system_prompt", self._limits, required=False)
            prompt = check_text(request.prompt, "prompt", self._limits, required=True)
            events = self._turns.generate(tenant, system_prompt, prompt, options_of(request.options))
        async for token, stats in _stream(events, started, "generate"):
            yield (
                api.GenerateResponse(token=token) if token is not None else api.GenerateResponse(stats=stats)
            )

    async def GetSession(
        self, request: api.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> api.GetSessionResponse:
        tenant = self._caller(context).tenant_for(request.tenant)
        record = await self._sessions.get(tenant, check_session_id(request.session_id))
        return api.GetSessionResponse(session=session_message(record, with_messages=True))

    async def DeleteSession(
        self, request: api.DeleteSessionRequest, context: grpc.aio.ServicerContext
    ) -> api.DeleteSessionResponse:
        tenant = self._caller(context).tenant_for(request.tenant)
        released = await self._sessions.delete(tenant, check_session_id(request.session_id))
        return api.DeleteSessionResponse(released_chunks=released)

    async def ListSessions(
        self, request: api.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> api.ListSessionsResponse:
        tenant = self._caller(context).tenant_for(request.tenant)
        page_size, after_id = check_page(request)
        # One more than asked: whether a next page exists without an extra round trip.
        records = await self._sessions.list(tenant, after_id, page_size + 1)
        page = records[:page_size]
        next_token = page[-1].session_id if len(records) > page_size else ""
        return api.ListSessionsResponse(
            sessions=[session_message(record, with_messages=False) for record in page],
            next_page_token=next_token,
        )

    async def RegisterSchema(
        self, request: api.RegisterSchemaRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api.RegisterSchemaResponse]:
        tenant = self._caller(context).tenant
        async for event in self._schemas.register(tenant, request.schema):
            if isinstance(event, SchemaRecord):
                yield api.RegisterSchemaResponse(schema=schema_message(event))
            else:
                progress = api.SchemaEncodeProgress(
                    done=event.done, total=event.total, module=event.module, encoded=event.encoded
                )
                yield api.RegisterSchemaResponse(progress=progress)

    async def ListSchemas(
        self, request: api.ListSchemasRequest, context: grpc.aio.ServicerContext
    ) -> api.ListSchemasResponse:
        tenant = self._caller(context).tenant
        return api.ListSchemasResponse(schemas=[schema_message(r) for r in await self._schemas.list(tenant)])

    async def DeleteSchema(
        self, request: api.DeleteSchemaRequest, context: grpc.aio.ServicerContext
    ) -> api.DeleteSchemaResponse:
        tenant = self._caller(context).tenant
        return api.DeleteSchemaResponse(deleted=await self._schemas.delete(tenant, request.name))


def options_of(options: api.GenerationOptions) -> GenerationOptions:
    """A request's options as the scheduler's: an absent optional field is None."""

    def present(name: str) -> Any:
        return getattr(options, name) if options.HasField(name) else None

    return same_named(
        GenerationOptions,
        options,
        temperature=present("temperature"),
        top_p=present("top_p"),
        seed=present("seed"),
        stop=tuple(options.stop),
    )


def schema_message(record: SchemaRecord) -> api.SchemaInfo:
    return api.SchemaInfo(
        name=record.name,
        digest=record.digest,
        modules=record.modules,
        document_bytes=len(record.document.encode()),
        registered_at_unix_ms=int(record.registered_at * 1000),
    )


async def _stream(
    events: AsyncIterator[TurnEvent], started: float, kind: str
) -> AsyncIterator[tuple[api.TokenText | None, api.TurnStats | None]]:
    """(token, None) per token, then (None, stats); records TTFT and the outcome."""
    first_token_at: float | None = None
    outcome = "failed"
    try:
        async for event in events:
            if isinstance(event, TurnOutcome):
                ttft = (first_token_at or time.monotonic()) - started
                metrics.TTFT_SECONDS.labels(kind).observe(ttft)
                outcome = "ok"
                yield None, turn_stats(event, ttft)
                return
            first_token_at = first_token_at or time.monotonic()
            yield api.TokenText(text=event.text, token_id=event.token_id, sample_index=event.sample), None
    finally:
        if outcome != "ok":
            metrics.TURNS.labels(kind, outcome).inc()


def turn_stats(outcome: TurnOutcome, ttft_seconds: float) -> api.TurnStats:
    stats, prompt = outcome.stats, outcome.prompt_token_ids
    return api.TurnStats(
        prompt_tokens=stats.prompt_tokens,
        reused_tokens=stats.reused_tokens,
        generated_tokens=stats.generated_tokens,
        ttft_ms=ttft_seconds * 1000,
        worker_ttft_ms=stats.ttft_ms,
        queue_wait_ms=outcome.queue_wait_seconds * 1000,
        truncated_tokens=stats.truncated_tokens,
        finish_reason=finish_reason_to_proto(stats.finish_reason),
        attempts=outcome.attempts,
        node=outcome.node,
        history_tokens=len(prompt) + len(outcome.token_ids) + outcome.closing_tokens
        if prompt is not None
        else 0,
        session_saved=outcome.session_saved,
        kv_unavailable_reason=stats.namespace_refused,
        samples=samples_to_proto(stats.samples),
        module_tokens=stats.module_tokens,
        computed_tokens=stats.prompt_tokens - stats.reused_tokens,
        repaired_tokens=stats.repaired_tokens,
        encoded_modules=stats.encoded_modules,
        restore_plan=stats.restore_plan,
        restore_recompute_ms=stats.restore_ms[0],
        restore_hidden_ms=stats.restore_ms[1],
        restore_kv_ms=stats.restore_ms[2],
    )


def message_of(message: Message) -> api.Message:
    return api.Message(
        role=_ROLES[message.role],
        content=message.content,
        finish_reason=finish_reason_to_proto(message.finish_reason),
    )


def session_message(record: SessionRecord, *, with_messages: bool) -> api.Session:
    def millis(seconds: float) -> int:
        return int(seconds * 1000)

    return api.Session(
        session_id=record.session_id,
        tenant=record.tenant,
        messages=[message_of(message) for message in record.messages] if with_messages else [],
        turns=record.turns,
        history_tokens=len(record.token_ids),
        truncated_tokens=record.truncated_tokens,
        cached_chunks=len(record.chunk_keys),
        node=record.node,
        created_at_unix_ms=millis(record.created_at),
        updated_at_unix_ms=millis(record.updated_at),
        expires_at_unix_ms=millis(record.expires_at),
        ttl_seconds=record.ttl_seconds,
    )
