"""The gRPC edge of the worker: checks requests, hands turns to the turn engine, and
maps its events to replies (tokens, then the turn's stats last)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc

from attnstore.errors import InvalidArgument
from attnstore.finish_reasons import finish_reason_to_proto, samples_to_proto
from attnstore.same_named import same_named
from attnstore.worker.v1 import worker_pb2 as pb
from attnstore.worker.v1 import worker_pb2_grpc
from inference_worker import metrics
from inference_worker.chat_template import ChatTemplate
from inference_worker.modules.module_store import Origin
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import Fallback, ModuleTurnInput, TurnInput, TurnStats
from inference_worker.validation import (
    RequestLimits,
    check_history_tokens,
    check_messages,
    check_prompt,
    check_repair,
    check_sampling,
    check_tenant,
    check_text,
)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Worker"].full_name

_FALLBACK = {
    None: pb.FALLBACK_NONE,
    Fallback.DAEMON_UNAVAILABLE: pb.FALLBACK_DAEMON_UNAVAILABLE,
    Fallback.DEADLINE: pb.FALLBACK_DEADLINE,
    Fallback.CHUNK_INVALID: pb.FALLBACK_CHUNK_INVALID,
}


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(
        self,
        engine: TurnEngine,
        template: ChatTemplate,
        limits: RequestLimits,
        model: pb.DescribeModelResponse,
    ) -> None:
        self._engine = engine
        self._template = template
        self._limits = limits
        self._model = model

    async def ExecuteTurn(
        self, request: pb.ExecuteTurnRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ExecuteTurnResponse]:
        salt = check_tenant(request.tenant)
        if request.WhichOneof("prompt") == "pml":
            repair_tokens, repair_fraction, repair_method = check_repair(request.pml)
            module_turn = ModuleTurnInput(
                request.pml.schema,
                request.pml.prompt,
                check_sampling(request.sampling, self._limits),
                repair_tokens=repair_tokens,
                repair_fraction=repair_fraction,
                repair_method=repair_method,
                add_generation_prompt=request.pml.add_generation_prompt,
            )
            turn_events = self._engine.modules.run(module_turn, await self._engine.namespace_for(salt))
        else:
            turn = self._turn_input(request)
            turn_events = self._engine.run_turn(turn, await self._engine.namespace_for(salt))
        # aclosing: a cancelled call (client gone) stops decoding at once.
        async with contextlib.aclosing(turn_events) as events:
            async for event in events:
                if isinstance(event, TurnStats):
                    metrics.observe_turn(event)
                    yield pb.ExecuteTurnResponse(stats=stats_message(event))
                    return
                token = pb.TokenChunk(token_id=event.token_id, text=event.text, sample_index=event.sample)
                yield pb.ExecuteTurnResponse(token=token)

    async def EncodeSchema(
        self, request: pb.EncodeSchemaRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EncodeSchemaResponse]:
        source = await self._engine.namespace_for(check_tenant(request.tenant))
        async with contextlib.aclosing(self._engine.modules.server.encode(source, request.schema)) as steps:
            async for step in steps:
                yield pb.EncodeSchemaResponse(
                    done=step.done,
                    total=step.total,
                    module=step.path,
                    encoded=step.origin is Origin.ENCODED,
                    namespace=step.namespace,
                    chunk_keys=step.chunk_keys,
                )

    def _turn_input(self, request: pb.ExecuteTurnRequest) -> TurnInput:
        sampling = check_sampling(request.sampling, self._limits)
        if request.WhichOneof("prompt") == "messages":
            messages = check_messages(request.messages.messages, self._limits)
            ids = self._template.token_ids(messages, add_generation_prompt=True)
            ids = check_prompt(ids, self._limits, "the chat-templated messages")
        else:  # an unset prompt is an empty token list
            ids = check_prompt(request.prompt_token_ids.token_ids, self._limits)
        turn = TurnInput(
            prompt_token_ids=ids,
            sampling=sampling,
            truncated_tokens=request.truncated_tokens,
            save_generated=request.save_generated,
            history_tokens=check_history_tokens(request.history_tokens, len(ids)),
            long_context_peers=tuple(request.long_context_peers),
        )
        return turn

    async def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        if request.text:  # raw text (OpenAI's /v1/completions), no chat template
            ids = self._template.text_ids(check_text(request.text, bool(request.messages), self._limits))
            return pb.TokenizeResponse(token_ids=ids)
        messages = check_messages(request.messages, self._limits)
        if request.after_contents > len(messages):
            raise InvalidArgument(
                f"after_contents is {request.after_contents}, more than the {len(messages)} messages"
            )
        ids = self._template.token_ids(
            messages,
            add_generation_prompt=request.add_generation_prompt,
            after_contents=request.after_contents,
        )
        return pb.TokenizeResponse(token_ids=ids)

    async def DescribeModel(
        self, request: pb.DescribeModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeModelResponse:
        return self._model


def stats_message(stats: TurnStats) -> pb.TurnStats:
    return same_named(
        pb.TurnStats,
        stats,
        ttft_ms=stats.ttft_seconds * 1000,
        kv_load_ms=stats.kv_load_seconds * 1000,
        kv_load_exposed_ms=stats.kv_load_exposed_seconds * 1000,
        compute_ms=stats.compute_seconds * 1000,
        fallback=_FALLBACK[stats.fallback],
        finish_reason=finish_reason_to_proto(stats.finish_reason),
        samples=samples_to_proto(stats.samples),
        restore_recompute_ms=stats.restore_seconds.get("recompute", 0.0) * 1000,
        restore_hidden_ms=stats.restore_seconds.get("hidden", 0.0) * 1000,
        restore_kv_ms=stats.restore_seconds.get("kv", 0.0) * 1000,
    )
