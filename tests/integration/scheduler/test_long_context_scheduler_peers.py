"""Long contexts with no static peers list: a scheduler in front of three workers whose KV
pools hold 64 tokens each, every one with long_context.peers_from_scheduler. The scheduler
names the other workers with each turn (ExecuteTurnRequest.long_context_peers), so a chat
turn of a few hundred tokens is admitted (up to the workers' max_context_tokens) and
answered over whichever worker runs it and the other two, with the same greedy tokens as
plain forwards of the whole sequence; past max_context_tokens the scheduler refuses it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from scheduler_stack import Stack, start_stack
from transformers import AutoModelForCausalLM

from attnstore.worker.v1 import worker_pb2 as pb
from attnstore.worker.v1 import worker_pb2_grpc

KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 8 * 4  # the tiny Llama: layers x K,V x kv_heads x head_dim x fp32
MAX_CONTEXT_TOKENS = 600
SYSTEM = "you are a helpful assistant"
LONG_MESSAGE = " ".join(["the capital of france is paris and the sky is blue"] * 16)
NODES = ("node-a", "node-b", "node-c")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, scheduler_model_dir: Path) -> Iterator[Stack]:
    long_context = {
        "peers_from_scheduler": True,
        "max_context_tokens": MAX_CONTEXT_TOKENS,
        "segment_tokens": 64,
    }
    started = start_stack(tmp_path_factory.mktemp("scheduler-peers"), scheduler_model_dir, redis=None,
                          worker_nodes=NODES,
                          worker_settings={"kv_memory_bytes": 64 * KV_BYTES_PER_TOKEN, "long_context": long_context})  # fmt: skip
    try:
        yield started
    finally:
        started.close()


def check_a_long_chat_runs_over_the_other_workers(stack: Stack, nodes: tuple[str, ...]) -> None:
    """A chat turn longer than every pool: answered with the greedy tokens of plain forwards
    over the whole sequence, by one worker whose log names every other as its peer."""
    client = stack.client()
    session = client.create_session(system_prompt=SYSTEM)
    answer = client.chat(session.session_id, LONG_MESSAGE, max_tokens=8)
    assert answer.stats is not None and answer.stats.prompt_tokens > 64
    with grpc.insecure_channel(stack.workers[nodes[0]].address) as channel:
        messages = [
            pb.ChatMessage(role="system", content=SYSTEM),
            pb.ChatMessage(role="user", content=LONG_MESSAGE),
        ]
        request = pb.TokenizeRequest(messages=messages, add_generation_prompt=True)
        prompt = list(worker_pb2_grpc.WorkerStub(channel).Tokenize(request, timeout=30).token_ids)
    assert len(prompt) == answer.stats.prompt_tokens
    model = AutoModelForCausalLM.from_pretrained(stack.model_dir, dtype=torch.float32).eval()
    expected: list[int] = []
    with torch.no_grad():  # greedy by plain forwards over the whole sequence
        while len(expected) < len(answer.token_ids):
            expected.append(int(model(input_ids=torch.tensor([prompt + expected])).logits[0, -1].argmax()))
    assert answer.token_ids == expected and len(expected) >= 1
    logs = {node: stack.workers[node].log_path.read_text() for node in nodes}
    [ran] = [node for node, log in logs.items() if "long_context_turn" in log]
    assert all(stack.workers[node].address in logs[ran] for node in nodes if node != ran)  # its peers


def test_a_chat_longer_than_every_pool_runs_over_the_workers_the_scheduler_names(stack: Stack) -> None:
    check_a_long_chat_runs_over_the_other_workers(stack, NODES)


def test_past_the_maximum_context_the_scheduler_refuses(stack: Stack) -> None:
    session = stack.client().create_session(system_prompt=SYSTEM)
    with pytest.raises(grpc.RpcError) as refused:
        stack.client().chat(session.session_id, " ".join([LONG_MESSAGE] * 4), max_tokens=8)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"a worker serves at most {MAX_CONTEXT_TOKENS}" in (refused.value.details() or "")
