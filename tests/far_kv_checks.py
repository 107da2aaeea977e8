"""Checks shared by the tests of a sequence whose home is the test process and whose
oldest KV lives on worker processes (DGFM's recall, attaching): what a worker lends, and
greedy decode steps checked against the plain forward."""

from __future__ import annotations

import grpc
import torch
from transformers import PreTrainedModel

from attnstore.worker.v1 import micro_attention_pb2 as pb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.context import LongContext

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
