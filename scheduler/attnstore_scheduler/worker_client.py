"""The scheduler's one client of a worker: it takes and returns the scheduler's own types
(worker_types.py, turn_types.py) and is the only place that calls the worker's gRPC API.
A call's failure is the grpc.aio.AioRpcError the worker answered; each caller decides what
its status means (turn_runner.py retries, turns.py and schemas.py pass refusals on)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from attnstore.worker.v1 import worker_pb2, worker_pb2_grpc
from attnstore_scheduler import worker_messages as wire
from attnstore_scheduler.turn_types import Token, WorkerStats
from attnstore_scheduler.worker_types import EncodedModule, ModelCard, TurnRequest

TOKENIZE_TIMEOUT_SECONDS = 30.0


class WorkerClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = worker_pb2_grpc.WorkerStub(channel)

    async def describe_model(self, *, timeout_seconds: float) -> ModelCard:
        reply = await self._stub.DescribeModel(worker_pb2.DescribeModelRequest(), timeout=timeout_seconds)
        return wire.model_card(reply)

    async def tokenize(
        self, messages: tuple[tuple[str, str], ...], *, add_generation_prompt: bool, after_contents: int = 0
    ) -> list[int]:
        """The ids of `messages` (role, content) under the chat template; `after_contents`
        n > 0: only what follows the content of the n-th message."""
        request = worker_pb2.TokenizeRequest(
            messages=wire.chat_messages(messages),
            add_generation_prompt=add_generation_prompt,
            after_contents=after_contents,
        )
        return list((await self._stub.Tokenize(request, timeout=TOKENIZE_TIMEOUT_SECONDS)).token_ids)

    async def tokenize_text(self, text: str) -> list[int]:
        """The ids of raw text, without the chat template."""
        request = worker_pb2.TokenizeRequest(text=text)
        return list((await self._stub.Tokenize(request, timeout=TOKENIZE_TIMEOUT_SECONDS)).token_ids)

    async def encode_schema(
        self, tenant: str, document: str, *, timeout_seconds: float
    ) -> AsyncIterator[EncodedModule]:
        request = worker_pb2.EncodeSchemaRequest(tenant=tenant, schema=document)
        async for reply in self._stub.EncodeSchema(request, timeout=timeout_seconds):
            yield wire.encoded_module(reply)

    async def execute_turn(
        self, request: TurnRequest, *, timeout_seconds: float
    ) -> AsyncIterator[Token | WorkerStats]:
        """The turn's tokens as they come, then the worker's stats (a stream without them
        just ends). Leaving early cancels the call, which stops the worker."""
        call = self._stub.ExecuteTurn(wire.turn_request(request), timeout=timeout_seconds)
        try:
            async for reply in call:
                if reply.HasField("stats"):
                    yield wire.worker_stats(reply.stats)
                    return
                yield wire.token(reply.token)
        finally:
            call.cancel()  # no-op when it ended; stops the worker when our caller left
