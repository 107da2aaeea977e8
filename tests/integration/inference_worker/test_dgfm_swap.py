"""DGFM swaps on real segments: two worker processes on loopback stand for nodes A and B;
sequence X (home A) keeps its oldest KV on B and sequence Y (home B) on A, so the debts
form the cycle A -> B -> A. The swap planned from those debts moves each sequence's
segments home (ReadKV, AppendKV, ReleaseKV between steps): afterwards A holds only X's KV
and B only Y's, each node holds as many bytes as before, no debt is left, and both
sequences go on decoding with logits within 1e-4 of the plain forward. A debt below the
minimum swap size plans no swap."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch
from running_workers import running_workers
from transformers import AutoModelForCausalLM, PreTrainedModel

from attnstore.debt_graph import plan_swaps
from attnstore.worker.v1 import micro_attention_pb2 as pb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.context import LongContext
from inference_worker.dist_attention.dgfm_swap import debts_of, execute_swap
from inference_worker.dist_attention.remote import RemoteSegment, peer_channel
from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.launcher import WorkerProcess
from inference_worker.model_store import LoadedModel

TOLERANCE = 1e-4
PROMPT_TOKENS, NEW_TOKENS = 150, 6


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, tiny_model: LoadedModel) -> Iterator[list[WorkerProcess]]:
    with running_workers(
        tmp_path_factory.mktemp("dgfm"), tiny_model.model_dir, {"node-a": {}, "node-b": {}}
    ) as started:
        yield list(started.values())


def held_bytes(channel: grpc.Channel) -> int:
    stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
    return stub.DescribeLending(pb.DescribeLendingRequest(), timeout=10).held_bytes


def decode(model: PreTrainedModel, context: LongContext, logits: torch.Tensor, steps: int) -> torch.Tensor:
    """`steps` greedy decode steps, each checked against the plain forward; the last logits."""
    for _ in range(steps):
        logits = context.decode(int(torch.argmax(logits)))
        with torch.no_grad():
            expected = model(input_ids=torch.tensor([context.token_ids])).logits[0, -1].float()
        assert (logits - expected).abs().max() <= TOLERANCE
    return logits


def test_a_swap_brings_each_sequence_home_with_identical_answers(
    nodes: list[WorkerProcess], tiny_model: LoadedModel
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    a, b = (node.address for node in nodes)
    channels = {address: peer_channel(address) for address in (a, b)}

    def sequence(peer: str) -> LongContext:  # runs at the other node, its oldest KV on `peer`
        return LongContext(DistributedRunner(model), {peer: channels[peer]}, lambda: {peer: 400},
                           local_tokens=48, segment_tokens=40, chunk_tokens=16)  # fmt: skip

    x, y = sequence(b), sequence(a)
    gen = torch.Generator().manual_seed(3)
    last = {}
    for context in (x, y):
        prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=gen).tolist()
        last[id(context)] = decode(model, context, context.prefill(prompt, NEW_TOKENS), steps=2)
    homes = {a: [x], b: [y]}
    debts = debts_of(homes)
    remote_tokens = PROMPT_TOKENS + NEW_TOKENS - 48
    assert set(debts) == {(a, b), (b, a)} and debts[(a, b)] == debts[(b, a)] > 0
    before = {address: held_bytes(channel) for address, channel in channels.items()}
    assert before[a] == before[b] == debts[(a, b)]
    assert plan_swaps(debts, min_swap_bytes=debts[(a, b)] + 1) == []  # not worth a recall

    swaps = plan_swaps(debts, min_swap_bytes=1)
    assert len(swaps) == 1 and set(swaps[0].cycle) == {a, b}
    assert execute_swap(swaps[0], homes, channels) == 2 * debts[(a, b)]

    for context, home in ((x, a), (y, b)):
        remote = [p for p in context.places if isinstance(p, RemoteSegment)]
        assert {p.address for p in remote} == {home} and sum(p.tokens for p in remote) == remote_tokens
    assert debts_of(homes) == {}
    assert {address: held_bytes(channel) for address, channel in channels.items()} == before
    for context in (x, y):
        decode(model, context, last[id(context)], steps=3)
        context.close()
    assert held_bytes(channels[a]) == held_bytes(channels[b]) == 0
