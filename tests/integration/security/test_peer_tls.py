"""Long turns under TLS and internal auth: the peers' MicroAttention requires mutual TLS and
the internal token, and a worker whose KV pool holds 64 tokens answers a 160-token prompt
over them with its long_context.peer_channel credentials (the same greedy tokens as a
peer that holds it all); the same worker with a wrong token reaches no peer's room and
refuses the turn (RESOURCE_EXHAUSTED), never answering without part of the context."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from running_workers import running_workers
from secure_stack import channel, credentials, internal_auth, server_tls

from attnstore.security import sync_channel
from attnstore.worker.v1 import worker_pb2 as pb
from attnstore.worker.v1 import worker_pb2_grpc
from inference_worker.launcher import WorkerProcess

KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 8 * 4  # the tiny Llama: layers x K,V x kv_heads x head_dim x fp32
SMALL_POOL = {"chunk_tokens": 16, "kv_memory_bytes": 64 * KV_BYTES_PER_TOKEN}
PROMPT = [(7 * i + 3) % 300 for i in range(160)]


@pytest.fixture(scope="module")
def workers(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path], pki, tokens
) -> Iterator[dict[str, WorkerProcess]]:
    root = tmp_path_factory.mktemp("peer-tls")
    model_dir = tiny_model_saver(root / "model", max_position_embeddings=1024, initializer_range=0.2)
    secure = {"tls": server_tls(pki, mutual=True), "internal_auth": internal_auth(), "chunk_tokens": 16}
    with running_workers(root, model_dir, {"peer-a": secure, "peer-b": secure}) as peers:
        addresses = [peers["peer-a"].address, peers["peer-b"].address]
        homes = {
            name: {**SMALL_POOL, "long_context": {"peers": addresses, "segment_tokens": 32,
                                                  "peer_channel": channel(pki, cert=True, token=token)}}
            for name, token in (("home", tokens.worker), ("impostor", tokens.wrong))
        }  # fmt: skip
        with running_workers(root, model_dir, homes) as started:
            yield peers | started


def greedy_tokens(stub: worker_pb2_grpc.WorkerStub) -> list[int]:
    request = pb.ExecuteTurnRequest(
        tenant="t", prompt_token_ids=pb.TokenIds(token_ids=PROMPT), sampling=pb.SamplingParams(max_tokens=6)
    )
    return [reply.token.token_id for reply in stub.ExecuteTurn(request, timeout=120)][:-1]


def test_a_long_turn_calls_its_peers_with_tls_and_the_token(
    workers: dict[str, WorkerProcess], pki, tokens
) -> None:
    with grpc.insecure_channel(workers["home"].address) as plain:
        got = greedy_tokens(worker_pb2_grpc.WorkerStub(plain))
    peer = credentials(pki, cert=True, token=tokens.worker)
    with sync_channel(workers["peer-a"].address, peer) as secured:
        expected = greedy_tokens(worker_pb2_grpc.WorkerStub(secured))
    assert len(got) == 6 and got == expected
    log = workers["home"].log_path.read_text()
    assert "long_context_turn" in log
    assert workers["peer-a"].address in log and workers["peer-b"].address in log


def test_a_wrong_token_reaches_no_peer_and_the_turn_is_refused(workers: dict[str, WorkerProcess]) -> None:
    with grpc.insecure_channel(workers["impostor"].address) as plain, pytest.raises(grpc.RpcError) as refused:
        greedy_tokens(worker_pb2_grpc.WorkerStub(plain))
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the peers have room for 0" in (refused.value.details() or "")
    assert "UNAUTHENTICATED" in workers["impostor"].log_path.read_text()  # why: each peer refused the token
