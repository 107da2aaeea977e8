"""Turns longer than a worker's KV pool, through the worker's ExecuteTurn: real worker
processes on loopback ports standing for nodes. A worker whose pool holds 64 tokens, with
two peer workers, answers a 200-token prompt with the same greedy tokens as a worker whose
pool holds it all (and as plain forwards of the whole sequence), its oldest KV placed on both peers and
released there afterwards; past long_context.max_context_tokens it refuses with
RESOURCE_EXHAUSTED naming the setting; n > 1 is INVALID_ARGUMENT. Without peers the same
small pool refuses the turn (RESOURCE_EXHAUSTED) as before. A worker with no peers list
but long_context.peers_from_scheduler places on the peers the turn names (as the
scheduler does) and answers the same; the turn's peers are checked (INVALID_ARGUMENT)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch
from running_workers import running_workers
from transformers import AutoModelForCausalLM

from attnstore.worker.v1 import micro_attention_pb2 as mpb
from attnstore.worker.v1 import micro_attention_pb2_grpc, worker_pb2_grpc
from attnstore.worker.v1 import worker_pb2 as pb
from inference_worker.launcher import WorkerProcess
from inference_worker.model_store import LoadedModel

KV_BYTES_PER_TOKEN = 3 * 2 * 2 * 16 * 4  # the tiny Llama: layers x K,V x kv_heads x head_dim x fp32
POOL_TOKENS = 64
MAX_CONTEXT_TOKENS = 300
PEER_LIMITS = {"max_held_bytes": 4 << 20, "max_query_tokens": 2048}


@pytest.fixture(scope="module")
def workers(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: LoadedModel
) -> Iterator[dict[str, WorkerProcess]]:
    root, model_dir = tmp_path_factory.mktemp("long-turns"), tiny_model.model_dir
    peer = {"micro_attention": PEER_LIMITS}  # big pools: each also serves as "one big worker"
    with running_workers(root, model_dir, {"peer-a": peer, "peer-b": peer}) as peers:
        small = {"kv_memory_bytes": POOL_TOKENS * KV_BYTES_PER_TOKEN}
        long_context = {
            "peers": [peers["peer-a"].address, peers["peer-b"].address],
            "max_context_tokens": MAX_CONTEXT_TOKENS, "segment_tokens": 40,
        }  # fmt: skip
        scheduled = {"peers_from_scheduler": True, "max_context_tokens": MAX_CONTEXT_TOKENS,
                     "segment_tokens": 40, "max_turn_peers": 2}  # fmt: skip
        with running_workers(
            root, model_dir,
            {"home": {**small, "long_context": long_context}, "alone": small,
             "scheduled": {**small, "long_context": scheduled}},
        ) as homes:  # fmt: skip
            yield peers | homes


def greedy_turn(
    address: str, prompt: list[int], max_tokens: int, peers: tuple[str, ...] = (), **sampling: object
) -> tuple[list[int], pb.TurnStats]:
    with grpc.insecure_channel(address) as channel:
        request = pb.ExecuteTurnRequest(
            tenant="t",
            prompt_token_ids=pb.TokenIds(token_ids=prompt),
            sampling=pb.SamplingParams(max_tokens=max_tokens, **sampling),
            long_context_peers=peers,
        )
        replies = list(worker_pb2_grpc.WorkerStub(channel).ExecuteTurn(request, timeout=120))
    return [r.token.token_id for r in replies[:-1]], replies[-1].stats


def held_bytes(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
        return stub.DescribeLending(mpb.DescribeLendingRequest(), timeout=10).held_bytes


def test_a_prompt_longer_than_the_pool_answers_like_one_big_worker(
    workers: dict[str, WorkerProcess], tiny_model: LoadedModel
) -> None:
    prompt = torch.randint(0, 300, (200,), generator=torch.Generator().manual_seed(7)).tolist()
    tokens, stats = greedy_turn(workers["home"].address, prompt, max_tokens=8)
    big, _ = greedy_turn(workers["peer-a"].address, prompt, max_tokens=8)
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    generated = []
    with torch.no_grad():  # greedy by plain forwards over the whole sequence
        for _ in range(8):
            generated.append(int(model(input_ids=torch.tensor([prompt + generated])).logits[0, -1].argmax()))
    assert len(tokens) == 8 and stats.generated_tokens == 8 and stats.prompt_tokens == 200
    assert tokens == big == generated, (tokens, big, generated)
    log = workers["home"].log_path.read_text()
    assert (
        "long_context_turn" in log and workers["peer-a"].address in log and workers["peer-b"].address in log
    )
    assert held_bytes(workers["peer-a"].address) == held_bytes(workers["peer-b"].address) == 0  # released


def test_without_peers_the_small_pool_refuses_the_turn(workers: dict[str, WorkerProcess]) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        greedy_turn(workers["alone"].address, list(range(200)), max_tokens=8)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "KV pool" in (refused.value.details() or "")


def test_past_the_maximum_context_is_refused_by_name(workers: dict[str, WorkerProcess]) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        greedy_turn(workers["home"].address, list(range(295)), max_tokens=8)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "long_context.max_context_tokens" in (refused.value.details() or "")


def test_parallel_samples_of_a_long_turn_are_invalid(workers: dict[str, WorkerProcess]) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        greedy_turn(workers["home"].address, list(range(200)), max_tokens=8, n=2)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "one sample" in (refused.value.details() or "")


def test_peers_named_by_the_turn_serve_a_worker_without_a_peers_list(
    workers: dict[str, WorkerProcess],
) -> None:
    """The scheduler names its other workers in each turn (long_context_peers); a worker
    with long_context.peers_from_scheduler places on them, one without ignores them."""
    prompt = torch.randint(0, 300, (200,), generator=torch.Generator().manual_seed(7)).tolist()
    peers = (workers["peer-a"].address, workers["peer-b"].address)
    scheduled = workers["scheduled"].address
    with grpc.insecure_channel(scheduled) as channel:
        card = worker_pb2_grpc.WorkerStub(channel).DescribeModel(pb.DescribeModelRequest(), timeout=10)
    assert card.max_turn_context_tokens == MAX_CONTEXT_TOKENS  # what the scheduler admits up to
    tokens, stats = greedy_turn(scheduled, prompt, max_tokens=8, peers=peers)
    big, _ = greedy_turn(workers["peer-a"].address, prompt, max_tokens=8)
    assert tokens == big and stats.generated_tokens == 8
    assert held_bytes(peers[0]) == held_bytes(peers[1]) == 0  # released
    refusals = [
        (scheduled, (), grpc.StatusCode.RESOURCE_EXHAUSTED, "peers have room for 0"),
        (workers["alone"].address, peers, grpc.StatusCode.RESOURCE_EXHAUSTED, "KV pool"),
        (scheduled, (*peers, peers[0]), grpc.StatusCode.INVALID_ARGUMENT, "more than the 2 allowed"),
        (scheduled, ("a b:1",), grpc.StatusCode.INVALID_ARGUMENT, "not a gRPC target"),
        (scheduled, ("",), grpc.StatusCode.INVALID_ARGUMENT, "not a gRPC target"),
    ]
    for address, named, code, says in refusals:
        with pytest.raises(grpc.RpcError) as refused:
            greedy_turn(address, prompt, max_tokens=8, peers=named)
        assert refused.value.code() is code and says in (refused.value.details() or ""), named
