"""Chat turns on sessions and one-off Generate calls, from prompt to stored session.

A session's prompt is its token history (the previous prompt plus the tokens generated)
followed by the new message's tokens: the history is never re-tokenized, so its chunk
keys stay those of the KV the worker saved. The new message's tokens are what the chat
template adds for it: the template rendered over [last message, new message] minus the
rendering of [last message] (templates render message by message); a template for which
that is not a prefix gets the whole conversation rendered anew (correct, but that turn
reuses only the common prefix). A prompt that extends the history tells the worker where
the history ends (`history_tokens`), so it also reuses the history's partial last chunk.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import structlog

from attnstore.api.v1 import api_pb2 as api
from attnstore.errors import Unavailable
from attnstore.worker.v1 import worker_pb2
from attnstore_scheduler import metrics
from attnstore_scheduler.session_record import SessionRecord
from attnstore_scheduler.sessions import Sessions
from attnstore_scheduler.turn_runner import TurnRunner, TurnSpec
from attnstore_scheduler.turn_types import Token, TurnOutcome
from attnstore_scheduler.validation import ApiLimits, check_session_tokens, require_model, sampling
from attnstore_scheduler.worker_registry import WorkerHandle, WorkerRegistry

log = structlog.get_logger("attnstore_scheduler.turns")

_PREFIX_AFFINITY_ENTRIES = 4096
_TOKENIZE_TIMEOUT_SECONDS = 30.0

TurnEvent = Token | TurnOutcome


class Turns:
    def __init__(
        self, sessions: Sessions, runner: TurnRunner, registry: WorkerRegistry, limits: ApiLimits
    ) -> None:
        self._sessions = sessions
        self._runner = runner
        self._registry = registry
        self._limits = limits
        # (tenant, system prompt) -> the node that last ran a Generate with it, so prompts
        # sharing a system prompt land where its KV is.
        self._prefix_nodes: OrderedDict[tuple[str, str], str] = OrderedDict()

    async def chat(
        self, tenant: str, session_id: str, message: str, options: api.GenerationOptions
    ) -> AsyncIterator[TurnEvent]:
        """The answer's tokens, then the TurnOutcome (the session is stored by then)."""
        model = require_model(self._registry.model())
        params = sampling(options, self._limits, model)
        async with self._sessions.store.turn_lock(tenant, session_id):
            record = await self._sessions.get(tenant, session_id)

            async def prepare(worker: WorkerHandle) -> worker_pb2.ExecuteTurnRequest:
                prompt = await _chat_prompt(worker, record, message)
                check_session_tokens(len(prompt), params.max_tokens, self._limits)
                tokens_after = len(prompt) + params.max_tokens
                await self._sessions.check_kv_budget(record, tokens_after, model.kv_bytes_per_token)
                history = record.token_ids
                extends_history = tuple(prompt[: len(history)]) == tuple(history)
                return worker_pb2.ExecuteTurnRequest(
                    tenant=tenant,
                    prompt_token_ids=worker_pb2.TokenIds(token_ids=prompt),
                    sampling=params,
                    truncated_tokens=record.truncated_tokens,
                    save_generated=True,
                    history_tokens=len(history) if extends_history else 0,
                )

            readable = record.readable_chunk_keys(model.chunk_tokens)
            spec = TurnSpec(
                tenant=tenant,
                session_id=session_id,
                prepare=prepare,
                node=record.node or None,
                namespace=record.namespace,
                chunk_keys=readable,
                kv_bytes=len(readable) * model.chunk_tokens * model.kv_bytes_per_token,
            )
            async for event in self._runner.run(spec):
                if isinstance(event, TurnOutcome):
                    event = replace(event, session_saved=await self._store_turn(record, message, event))
                    _observe("chat", event)
                yield event

    async def _store_turn(self, record: SessionRecord, message: str, outcome: TurnOutcome) -> bool:
        """Whether the turn was stored; the client has its answer either way (see session_saved)."""
        stats = outcome.stats
        updated = replace(
            record,
            messages=(*record.messages, ("user", message), ("assistant", outcome.text)),
            token_ids=(*(outcome.prompt_token_ids or ()), *outcome.token_ids),
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
            return False
        if not saved:
            await self._sessions.release(updated)  # deleted during the turn: nothing keeps its KV
        elif record.node and record.node != outcome.node:
            await self._sessions.release(record)  # moved: the old node's copy will not be read
        return saved

    async def generate(
        self, tenant: str, system_prompt: str, prompt: str, options: api.GenerationOptions
    ) -> AsyncIterator[TurnEvent]:
        messages = [("system", system_prompt)] if system_prompt else []
        turn = self.complete(tenant, [*messages, ("user", prompt)], options, affinity=system_prompt)
        async for event in turn:
            yield event

    async def complete(
        self,
        tenant: str,
        prompt: Sequence[tuple[str, str]] | str,
        options: api.GenerationOptions,
        *,
        affinity: str,
        kind: str = "generate",
    ) -> AsyncIterator[TurnEvent]:
        """A turn outside any session over chat messages (role, content; the worker applies
        the chat template) or raw text (tokenized as is). Its prompt's full chunks are saved,
        so a later prompt that starts with the same tokens reuses them. Turns with the same
        `affinity` text go to the node that ran the last one (where that KV is)."""
        params = sampling(options, self._limits, require_model(self._registry.model()))

        async def prepare(worker: WorkerHandle) -> worker_pb2.ExecuteTurnRequest:
            request = worker_pb2.ExecuteTurnRequest(tenant=tenant, sampling=params)
            if isinstance(prompt, str):
                reply = await worker.stub.Tokenize(
                    worker_pb2.TokenizeRequest(text=prompt), timeout=_TOKENIZE_TIMEOUT_SECONDS
                )
                request.prompt_token_ids.token_ids.extend(reply.token_ids)
            else:
                request.messages.messages.extend(
                    worker_pb2.ChatMessage(role=role, content=content) for role, content in prompt
                )
            return request

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


async def _chat_prompt(worker: WorkerHandle, record: SessionRecord, message: str) -> list[int]:
    """The turn's prompt token ids (see the module doc)."""
    new = ("user", message)
    if not record.token_ids:  # the first turn: the system prompt (if any) and the message
        return await _tokenize(worker, [*record.messages, new], add_generation_prompt=True)
    last = record.messages[-1:]
    with_new, without = await asyncio.gather(
        _tokenize(worker, [*last, new], add_generation_prompt=True),
        _tokenize(worker, last, add_generation_prompt=False),
    )
    if with_new[: len(without)] == without:
        return [*record.token_ids, *with_new[len(without) :]]
    return await _tokenize(worker, [*record.messages, new], add_generation_prompt=True)


async def _tokenize(
    worker: WorkerHandle, messages: Sequence[tuple[str, str]], *, add_generation_prompt: bool
) -> list[int]:
    request = worker_pb2.TokenizeRequest(
        messages=[worker_pb2.ChatMessage(role=role, content=content) for role, content in messages],
        add_generation_prompt=add_generation_prompt,
    )
    reply = await worker.stub.Tokenize(request, timeout=_TOKENIZE_TIMEOUT_SECONDS)
    return list(reply.token_ids)


def _observe(kind: str, outcome: TurnOutcome) -> None:
    stats = outcome.stats
    unsaved = kind == "chat" and not outcome.session_saved  # answered, but the session store failed
    metrics.TURNS.labels(kind, "not_saved" if unsaved else "ok").inc()
    metrics.PROMPT_TOKENS.inc(stats.prompt_tokens)
    metrics.REUSED_TOKENS.inc(stats.reused_tokens)
    if stats.prompt_tokens:
        metrics.HIT_RATIO.labels(kind).observe(stats.reused_tokens / stats.prompt_tokens)
