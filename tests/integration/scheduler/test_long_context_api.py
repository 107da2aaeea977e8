"""Long contexts through the public API: a scheduler in front of one worker whose KV pool
holds 64 tokens, with two peer workers for its long turns (long_context.peers). A chat
turn of a few hundred tokens is admitted and answered with the same greedy tokens as a
peer whose pool holds it all, its oldest KV on both peers; a turn past the worker's
long_context.max_context_tokens is refused by the scheduler with RESOURCE_EXHAUSTED naming
the limit, before any worker runs it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from running_workers import running_workers
from scheduler_stack import CHUNK_TOKENS, Stack, start_stack

from attnstore.worker.v1 import worker_pb2 as pb
from attnstore.worker.v1 import worker_pb2_grpc
from inference_worker.launcher import WorkerProcess

KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 8 * 4  # the tiny Llama: layers x K,V x kv_heads x head_dim x fp32
MAX_CONTEXT_TOKENS = 600
SYSTEM = "you are a helpful assistant"
LONG_MESSAGE = " ".join(["the capital of france is paris and the sky is blue"] * 16)


@dataclass
class LongStack:
    stack: Stack
    peers: list[WorkerProcess]


@pytest.fixture(scope="module")
def long_stack(tmp_path_factory: pytest.TempPathFactory, scheduler_model_dir: Path) -> Iterator[LongStack]:
    root = tmp_path_factory.mktemp("long-api")
    peer = {"chunk_tokens": CHUNK_TOKENS}
    with running_workers(root, scheduler_model_dir, {"peer-a": peer, "peer-b": peer}) as started:
        peers = list(started.values())
        long_context = {"peers": [p.address for p in peers], "max_context_tokens": MAX_CONTEXT_TOKENS,
                        "segment_tokens": 64}  # fmt: skip
        stack = start_stack(root / "stack", scheduler_model_dir, redis=None, worker_nodes=("node-a",),
                            worker_settings={"kv_memory_bytes": 64 * KV_BYTES_PER_TOKEN, "long_context": long_context})  # fmt: skip
        try:
            yield LongStack(stack, peers)
        finally:
            stack.close()


def test_a_chat_longer_than_the_pool_is_admitted_and_answered_like_one_big_worker(
    long_stack: LongStack,
) -> None:
    client = long_stack.stack.client()
    session = client.create_session(system_prompt=SYSTEM)
    answer = client.chat(session.session_id, LONG_MESSAGE, max_tokens=8)
    assert answer.stats is not None and answer.stats.prompt_tokens > 64
    with grpc.insecure_channel(long_stack.peers[0].address) as channel:  # a worker whose pool holds it all
        stub = worker_pb2_grpc.WorkerStub(channel)
        messages = [
            pb.ChatMessage(role="system", content=SYSTEM),
            pb.ChatMessage(role="user", content=LONG_MESSAGE),
        ]
        prompt = stub.Tokenize(
            pb.TokenizeRequest(messages=messages, add_generation_prompt=True), timeout=30
        ).token_ids
        assert len(prompt) == answer.stats.prompt_tokens
        request = pb.ExecuteTurnRequest(tenant="t", prompt_token_ids=pb.TokenIds(token_ids=prompt),
                                        sampling=pb.SamplingParams(max_tokens=8))  # fmt: skip
        expected = [r.token.token_id for r in stub.ExecuteTurn(request, timeout=120)][:-1]
    assert answer.token_ids == expected
    log = long_stack.stack.local.worker.log_path.read_text()
    assert "long_context_turn" in log and all(p.address in log for p in long_stack.peers)


def test_a_turn_past_the_maximum_context_is_refused_by_the_scheduler(long_stack: LongStack) -> None:
    client = long_stack.stack.client()
    session = client.create_session(system_prompt=SYSTEM)
    with pytest.raises(grpc.RpcError) as refused:
        client.chat(session.session_id, " ".join([LONG_MESSAGE] * 4), max_tokens=8)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"a worker serves at most {MAX_CONTEXT_TOKENS}" in (refused.value.details() or "")
