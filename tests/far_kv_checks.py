"""Checks shared by the tests of a sequence whose home is the test process and whose
oldest KV lives on worker processes (DGFM's recall, attaching, lending through the
ledger): what a worker lends, what the pool's ledger says a daemon lends, greedy decode
steps checked against the plain forward, greedy tokens by plain forwards, and a greedy turn
through ExecuteTurn."""

from __future__ import annotations

import asyncio

import grpc
import redis.asyncio as aioredis
import torch
from transformers import PreTrainedModel

from attnstore.pool_ledger import PoolLedger
from attnstore.worker.v1 import micro_attention_pb2 as pb
from attnstore.worker.v1 import micro_attention_pb2_grpc, worker_pb2_grpc
from attnstore.worker.v1 import worker_pb2 as wpb
from inference_worker.dist_attention.context import LongContext
from kvstore_daemon.launcher import DaemonProcess

TOLERANCE = 1e-4


def lending(channel: grpc.Channel) -> pb.DescribeLendingResponse:
    stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
    return stub.DescribeLending(pb.DescribeLendingRequest(), timeout=10)


def decode(model: PreTrainedModel, context: LongContext, logits: torch.Tensor, steps: int) -> torch.Tensor:
    """`steps` greedy decode steps, each checked against the plain forward; the last logits."""
    for _ in range(steps):
        logits = context.decode(int(torch.argmax(logits)))
        with torch.no_grad():
            expected = model(input_ids=torch.tensor([context.token_ids])).logits[0, -1].float()
        assert (logits - expected).abs().max() <= TOLERANCE
    return logits


def plain_greedy(model: PreTrainedModel, prompt: list[int], max_tokens: int) -> list[int]:
    """`max_tokens` greedy tokens by plain forwards over the whole sequence."""
    generated: list[int] = []
    with torch.no_grad():
        for _ in range(max_tokens):
            generated.append(int(model(input_ids=torch.tensor([prompt + generated])).logits[0, -1].argmax()))
    return generated


def lent_bytes(redis_url: str, daemon: DaemonProcess) -> int:
    """What the pool's ledger says `daemon` lends now."""

    async def read() -> int:
        client = aioredis.Redis.from_url(redis_url)
        try:
            entries = {e.grpc_address: e for e in await PoolLedger.reader(client).members()}
        finally:
            await client.aclose()
        return entries[daemon.address].lent_bytes if daemon.address in entries else -1

    return asyncio.run(read())


def run_turn(address: str, prompt: list[int], max_tokens: int, outcome: dict[str, object]) -> None:
    """A greedy ExecuteTurn; its tokens, or its error, in `outcome`."""
    with grpc.insecure_channel(address) as channel:
        request = wpb.ExecuteTurnRequest(tenant="t", prompt_token_ids=wpb.TokenIds(token_ids=prompt),
                                         sampling=wpb.SamplingParams(max_tokens=max_tokens))  # fmt: skip
        try:
            replies = list(worker_pb2_grpc.WorkerStub(channel).ExecuteTurn(request, timeout=240))
        except grpc.RpcError as exc:
            outcome["error"] = exc
            return
    outcome["tokens"] = [r.token.token_id for r in replies[:-1]]
