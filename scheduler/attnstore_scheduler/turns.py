"""Chat turns on sessions and one-off Generate calls, from prompt to stored session.

A chat turn's prompt is the session's token history followed by the new message, as
chat_prompt.py builds it; the stored history then adds the answer's generated ids and the
chat template's closing of the answer. A prompt that extends the history tells the worker
where the history it ran ends (`history_tokens`), so it also reuses the history's partial
last chunk.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace

import grpc
import structlog

from attnstore.errors import FailedPrecondition, InvalidArgument, ServiceError, Unavailable
from attnstore_scheduler import metrics
from attnstore_scheduler.chat_prompt import answer_closing, chat_prompt, closing_after, tokenize
from attnstore_scheduler.pool_routing import PoolRouting
from attnstore_scheduler.schema_store import SchemaRecord
from attnstore_scheduler.session_activity import Expectation
from attnstore_scheduler.session_record import Message, SessionRecord
from attnstore_scheduler.sessions import Sessions, activity_id
from attnstore_scheduler.turn_runner import PrepareTurn, TurnRunner, TurnSpec
from attnstore_scheduler.turn_types import GenerationOptions, Token, TurnOutcome
from attnstore_scheduler.validation import (
    ApiLimits,
    check_session_tokens,
    check_system_prompt_tokens,
    check_turn_context,
    require_model,
    sampling,
)
from attnstore_scheduler.worker_registry import WorkerHandle, WorkerRegistry
from attnstore_scheduler.worker_types import ChatMessages, PmlPrompt, TokenIds, TurnRequest

log = structlog.get_logger("attnstore_scheduler.turns")

_PREFIX_AFFINITY_ENTRIES = 4096
# What a worker's refusal to tokenize means to the caller (anything else: try later).
_TOKENIZE_REFUSALS: dict[grpc.StatusCode, type[ServiceError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,  # the template rejects the message
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,  # the model takes no messages
}

TurnEvent = Token | TurnOutcome


class Turns:
    def __init__(
        self,
        sessions: Sessions,
        runner: TurnRunner,
        registry: WorkerRegistry,
        limits: ApiLimits,
        pool: PoolRouting | None = None,
    ) -> None:
        """`pool`: pool-aware affinity (None: a session's turns go to its node)."""
        self._sessions = sessions
        self._pool = pool
        self._runner = runner
        self._registry = registry
        self._limits = limits
        # (tenant, system prompt) -> the node that last ran a Generate with it, so prompts
        # sharing a system prompt land where its KV is.
        self._prefix_nodes: OrderedDict[tuple[str, str], str] = OrderedDict()

    async def chat(
        self,
        tenant: str,
        session_id: str,
        message: str,
        options: GenerationOptions,
        expectation: Expectation | None = None,
    ) -> AsyncIterator[TurnEvent]:
        """The answer's tokens, then the TurnOutcome (the session is stored by then).
        `expectation`: the application's word on the turn after this one."""
        model = require_model(self._registry.model())
        params = sampling(options, self._limits, model, session=True)

        def preparer(record: SessionRecord, closings: list[list[int]]) -> PrepareTurn:
            async def prepare(worker: WorkerHandle) -> TurnRequest:
                prompt = await chat_prompt(worker, record, message)
                closings.append(prompt.answer_closing)
                prompt_tokens = len(prompt.token_ids) + len(prompt.answer_closing)
                check_session_tokens(prompt_tokens, params.max_tokens, self._limits)
                check_turn_context(len(prompt.token_ids), params.max_tokens, model)
                tokens_after = prompt_tokens + params.max_tokens
                await self._sessions.check_kv_budget(record, tokens_after, model.kv_bytes_per_token)
                return TurnRequest(
                    tenant=tenant,
                    prompt=TokenIds(tuple(prompt.token_ids)),
                    sampling=params,
                    truncated_tokens=record.truncated_tokens,
                    save_generated=True,
                    history_tokens=prompt.history_tokens,
                )

            return prepare

        async for event in self._session_turn(tenant, session_id, message, preparer, expectation):
            yield event

    async def chat_pml(
        self,
        tenant: str,
        session_id: str,
        schema: SchemaRecord,
        prompt: PmlPrompt,
        options: GenerationOptions,
        expectation: Expectation | None = None,
    ) -> AsyncIterator[TurnEvent]:
        """The first turn of a session as a PML prompt (its modules' KV served; nothing
        saved): the session's history becomes the prompt's tokens as served, then the answer.
        FailedPrecondition when the session has turns or a system prompt already."""
        params = sampling(options, self._limits, require_model(self._registry.model()), session=True)

        def preparer(record: SessionRecord, closings: list[list[int]]) -> PrepareTurn:
            if record.messages:
                raise FailedPrecondition(
                    f"pml may only start a session; this one holds {len(record.messages)} message(s) "
                    "(a system prompt or earlier turns): write the system prompt in the PML prompt"
                )

            async def prepare(worker: WorkerHandle) -> TurnRequest:
                closings.append(await answer_closing(worker, Message("user", prompt.prompt)))
                return TurnRequest(tenant, prompt, params)

            return prepare

        schema_node = self._prefix_nodes.get((tenant, _schema_affinity(schema.name)))
        async for event in self._session_turn(
            tenant, session_id, prompt.prompt, preparer, expectation, schema_node
        ):
            if isinstance(event, TurnOutcome):
                self.remember_schema_node(tenant, schema.name, event.node)
            yield event

    async def _session_turn(
        self,
        tenant: str,
        session_id: str,
        message: str,
        preparer: Callable[[SessionRecord, list[list[int]]], PrepareTurn],
        expectation: Expectation | None,
        first_node: str | None = None,
    ) -> AsyncIterator[TurnEvent]:
        """A turn of a session, under its lock: `preparer(record, closings)` gives the turn's
        request builder, which appends the answer's closing (from the worker that runs it)
        to `closings`. `first_node`: where a session without a node should run."""
        model = require_model(self._registry.model())
        async with self._sessions.store.turn_lock(tenant, session_id):
            record = await self._sessions.get(tenant, session_id)
            closings: list[list[int]] = []
            prepare = preparer(record, closings)
            readable = record.readable_chunk_keys(model.chunk_tokens)
            node = record.node or first_node
            if self._pool is not None:
                node = await self._pool.home(node, record.namespace, readable)
            spec = TurnSpec(
                tenant=tenant,
                session_id=session_id,
                prepare=prepare,
                node=node,
                namespace=record.namespace,
                chunk_keys=readable,
                kv_bytes=len(readable) * model.chunk_tokens * model.kv_bytes_per_token,
            )
            activity, name = self._sessions.activity, activity_id(tenant, session_id)
            if activity is not None:
                activity.turn_started(name, record.node, record.namespace, time.monotonic())
            try:
                async for event in self._runner.run(spec):
                    if isinstance(event, TurnOutcome):
                        event = await self._store_turn(record, message, event, closings[-1])
                        if activity is not None and event.session_saved:
                            now = time.monotonic()
                            activity.turn_ended(
                                name,
                                event.stats.chunk_keys,
                                now,
                                now + record.ttl_seconds,
                                event.node,
                                event.stats.namespace,
                            )
                            self._sessions.expect(tenant, session_id, expectation)
                        _observe("chat", event)
                    yield event
            finally:
                if activity is not None:
                    activity.turn_abandoned(name)  # no-op after turn_ended

    async def _store_turn(
        self, record: SessionRecord, message: str, outcome: TurnOutcome, template_closing: list[int]
    ) -> TurnOutcome:
        """Stores the turn; the outcome says whether it was stored (the client has its answer
        either way, see session_saved) and the closing the history added after the answer."""
        stats = outcome.stats
        closing = closing_after(outcome.token_ids, template_closing, stats.finish_reason)
        # A PML turn's request has no token ids: the worker says what it served.
        prompt_ids = outcome.prompt_token_ids or stats.prompt_token_ids
        outcome = replace(outcome, prompt_token_ids=prompt_ids)
        updated = replace(
            record,
            messages=(
                *record.messages,
                Message("user", message),
                Message("assistant", outcome.text, stats.finish_reason),
            ),
            token_ids=(*prompt_ids, *outcome.token_ids, *closing),
            closing_tokens=len(closing),
            turns=record.turns + 1,
            truncated_tokens=stats.truncated_tokens,
            sink_tokens=stats.sink_tokens,
            namespace=stats.namespace,
            chunk_keys=stats.chunk_keys,
            node=outcome.node,
            updated_at=time.time(),
        )
        try:
            saved = await self._sessions.store.save(updated)
        except Unavailable as exc:  # its tokens are out: say the turn did not count, not fail the call
            log.warning("turn_not_saved", tenant=record.tenant, session_id=record.session_id, error=str(exc))
            return replace(outcome, session_saved=False, closing_tokens=len(closing))
        if not saved:
            await self._sessions.release(updated)  # deleted during the turn: nothing keeps its KV
        elif record.node and record.node != outcome.node:
            await self._sessions.release(record)  # moved: the old node's copy will not be read
        return replace(outcome, session_saved=saved, closing_tokens=len(closing))

    async def check_system_prompt(self, system_prompt: str) -> None:
        """InvalidArgument when a session's system prompt is too many tokens to chat with;
        Unavailable when no worker can tokenize it."""
        model = require_model(self._registry.model())
        worker = next((w for w in self._registry.workers() if w.healthy and w.model is not None), None)
        if worker is None:
            raise Unavailable("no healthy worker is registered yet; retry later")
        try:
            ids = await tokenize(worker, [Message("system", system_prompt)], add_generation_prompt=True)
        except grpc.aio.AioRpcError as exc:
            error = _TOKENIZE_REFUSALS.get(exc.code(), Unavailable)
            raise error(f"the worker could not tokenize system_prompt: {exc.details()}") from exc
        check_system_prompt_tokens(len(ids), self._limits, model)

    async def generate(
        self, tenant: str, system_prompt: str, prompt: str, options: GenerationOptions
    ) -> AsyncIterator[TurnEvent]:
        messages = [("system", system_prompt)] if system_prompt else []
        turn = self.complete(tenant, [*messages, ("user", prompt)], options, affinity=system_prompt)
        async for event in turn:
            yield event

    async def complete(
        self,
        tenant: str,
        prompt: Sequence[tuple[str, str]] | str,
        options: GenerationOptions,
        *,
        affinity: str,
        kind: str = "generate",
    ) -> AsyncIterator[TurnEvent]:
        """A turn outside any session over chat messages (role, content; the worker applies
        the chat template) or raw text (tokenized as is). Its prompt's full chunks are saved,
        so a later prompt that starts with the same tokens reuses them. Turns with the same
        `affinity` text go to the node that ran the last one (where that KV is)."""
        model = require_model(self._registry.model())
        params = sampling(options, self._limits, model)

        async def prepare(worker: WorkerHandle) -> TurnRequest:
            if isinstance(prompt, str):
                token_ids = await worker.client.tokenize_text(prompt)
                check_turn_context(len(token_ids), params.max_tokens, model)
                return TurnRequest(tenant, TokenIds(tuple(token_ids)), params)
            return TurnRequest(tenant, ChatMessages(tuple(prompt)), params)

        async for event in self._one_off(tenant, prepare, affinity, kind):
            yield event

    async def generate_pml(
        self, tenant: str, schema: SchemaRecord, prompt: PmlPrompt, options: GenerationOptions
    ) -> AsyncIterator[TurnEvent]:
        """A one-off PML prompt against `schema`, sent where its modules were last encoded or
        served (the worker checks the prompt and encodes what its node's store lacks)."""
        params = sampling(options, self._limits, require_model(self._registry.model()))

        async def prepare(worker: WorkerHandle) -> TurnRequest:
            return TurnRequest(tenant, prompt, params)

        async for event in self._one_off(tenant, prepare, _schema_affinity(schema.name), "generate_pml"):
            yield event

    def remember_schema_node(self, tenant: str, schema_name: str, node: str) -> None:
        """Where a schema's module KV was encoded: its prompts go there."""
        self._remember_prefix_node((tenant, _schema_affinity(schema_name)), node)

    async def _one_off(
        self, tenant: str, prepare: PrepareTurn, affinity: str, kind: str
    ) -> AsyncIterator[TurnEvent]:
        prefix = (tenant, affinity)
        spec = TurnSpec(tenant=tenant, session_id="", prepare=prepare, node=self._prefix_nodes.get(prefix))
        async for event in self._runner.run(spec):
            if isinstance(event, TurnOutcome):
                self._remember_prefix_node(prefix, event.node)
                _observe(kind, event)
            yield event

    def _remember_prefix_node(self, prefix: tuple[str, str], node: str) -> None:
        self._prefix_nodes[prefix] = node
        self._prefix_nodes.move_to_end(prefix)
        while len(self._prefix_nodes) > _PREFIX_AFFINITY_ENTRIES:
            self._prefix_nodes.popitem(last=False)


def _schema_affinity(name: str) -> str:
    return f"\0schema:{name}"  # no system prompt starts with NUL: never a Generate's affinity


def _observe(kind: str, outcome: TurnOutcome) -> None:
    stats = outcome.stats
    unsaved = kind == "chat" and not outcome.session_saved  # answered, but the session store failed
    metrics.TURNS.labels(kind, "not_saved" if unsaved else "ok").inc()
    metrics.PROMPT_TOKENS.inc(stats.prompt_tokens)
    metrics.REUSED_TOKENS.inc(stats.reused_tokens)
    if stats.prompt_tokens:
        metrics.HIT_RATIO.labels(kind).observe(stats.reused_tokens / stats.prompt_tokens)
