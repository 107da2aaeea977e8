"""The scheduler's worker types to and from the worker's messages (worker_pb2), for
worker_client.py: fields that share a name are copied by same_named, so one added on both
sides cannot be left out."""

from __future__ import annotations

from attnstore.finish_reasons import finish_reason_from_proto
from attnstore.same_named import same_named
from attnstore.worker.v1 import worker_pb2
from attnstore_scheduler.turn_types import FinishReason, SampleStats, Token, WorkerStats
from attnstore_scheduler.worker_types import (
    ChatMessages,
    EncodedModule,
    ModelCard,
    SamplingParams,
    TokenIds,
    TurnRequest,
)


def chat_messages(messages: tuple[tuple[str, str], ...]) -> list[worker_pb2.ChatMessage]:
    return [worker_pb2.ChatMessage(role=role, content=content) for role, content in messages]


def turn_request(request: TurnRequest) -> worker_pb2.ExecuteTurnRequest:
    prompt = request.prompt
    message = same_named(
        worker_pb2.ExecuteTurnRequest,
        request,
        sampling=_sampling(request.sampling),
        messages=None,
        prompt_token_ids=None,
        pml=None,
    )
    if isinstance(prompt, ChatMessages):
        message.messages.messages.extend(chat_messages(prompt.messages))
    elif isinstance(prompt, TokenIds):
        message.prompt_token_ids.token_ids.extend(prompt.token_ids)
    else:
        message.pml.CopyFrom(same_named(worker_pb2.PmlPrompt, prompt))
    return message


def _sampling(params: SamplingParams) -> worker_pb2.SamplingParams:
    # An absent top_p or seed stays absent on the wire (None is not a value there).
    return same_named(
        worker_pb2.SamplingParams, params, stop_token_ids=(), top_p=params.top_p, seed=params.seed
    )


def model_card(reply: worker_pb2.DescribeModelResponse) -> ModelCard:
    return same_named(ModelCard, reply)


def encoded_module(reply: worker_pb2.EncodeSchemaResponse) -> EncodedModule:
    return same_named(EncodedModule, reply, chunk_keys=tuple(reply.chunk_keys))


def token(reply: worker_pb2.TokenChunk) -> Token:
    return Token(reply.token_id, reply.text, reply.sample_index)


def _finish(value: int) -> FinishReason:
    return FinishReason(finish_reason_from_proto(value))


def worker_stats(stats: worker_pb2.TurnStats) -> WorkerStats:
    return same_named(
        WorkerStats,
        stats,
        finish_reason=_finish(stats.finish_reason),
        chunk_keys=tuple(stats.chunk_keys),
        samples=tuple(
            SampleStats(sample.generated_tokens, _finish(sample.finish_reason)) for sample in stats.samples
        )
        or (SampleStats(stats.generated_tokens, _finish(stats.finish_reason)),),
        restore_ms=(stats.restore_recompute_ms, stats.restore_hidden_ms, stats.restore_kv_ms),
        prompt_token_ids=tuple(stats.prompt_token_ids),
    )
