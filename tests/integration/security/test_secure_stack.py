"""The whole stack with TLS on every endpoint: a daemon and a worker that require client
certificates and internal tokens, a scheduler dialing them with the admin token and
serving its public API over TLS. Chat runs end to end; a tenant reuses its own KV and
never another's (a shared system prompt gives another tenant no hit, so no timing
difference either); a tenant's stored KV is bounded."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from secure_stack import API_KEYS, CHUNK_TOKENS, SecureStack, credentials, start_secure_stack

from attnstore.api_client import AttnStoreClient, ClientCredentials
from attnstore.security import aio_channel
from attnstore.worker.v1 import worker_pb2, worker_pb2_grpc

SYSTEM = " ".join(["the capital of france is paris"] * 8)  # a few chunks of shared prefix
KV_LIMIT_TOKENS = 300
TINY_LLAMA_KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 8 * 4  # K and V x layers x kv heads x head dim x float32


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path], pki, tokens
) -> Iterator[SecureStack]:
    root = tmp_path_factory.mktemp("secure-stack")
    model_dir = tiny_model_saver(root / "model", max_position_embeddings=4096, initializer_range=0.2)
    limit = {"max_kv_bytes_per_tenant": KV_LIMIT_TOKENS * TINY_LLAMA_KV_BYTES_PER_TOKEN}
    secure = start_secure_stack(root, model_dir, pki, tokens, limit)
    try:
        yield secure
    finally:
        secure.close()


def test_a_chat_runs_end_to_end_over_tls(stack: SecureStack) -> None:
    client = stack.client("chat")
    session = client.create_session(system_prompt=SYSTEM)
    first = client.chat(session.session_id, "hello world", max_tokens=8)
    second = client.chat(session.session_id, "how are you", max_tokens=8)
    assert first.stats.generated_tokens >= 1 and first.stats.reused_tokens == 0
    assert second.stats.reused_tokens >= CHUNK_TOKENS  # the first turn's KV, through the daemon
    assert client.get_session(session.session_id).turns == 2
    # Every internal call carried good credentials: none was refused anywhere.
    for process in (stack.daemon, stack.worker, stack.scheduler):
        log = process.log_path.read_text(errors="replace")
        assert "rpc_refused" not in log and "PERMISSION_DENIED" not in log, process.log_tail()


def test_a_shared_system_prompt_is_reused_within_its_tenant_only(stack: SecureStack) -> None:
    acme, globex = stack.client("acme"), stack.client("globex")
    first = acme.create_session(system_prompt=SYSTEM)
    acme.chat(first.session_id, "hello world", max_tokens=4)
    second = acme.create_session(system_prompt=SYSTEM)
    other_tenant = globex.create_session(system_prompt=SYSTEM)

    same_tenant_turn = acme.chat(second.session_id, "how are you", max_tokens=4)
    other_tenant_turn = globex.chat(other_tenant.session_id, "how are you", max_tokens=4)
    assert same_tenant_turn.stats.reused_tokens >= CHUNK_TOKENS  # the system prompt's chunks
    # Its chunk keys are salted with its own tenant: a lookup cannot hit acme's KV.
    assert other_tenant_turn.stats.reused_tokens == 0
    assert other_tenant_turn.stats.prompt_tokens == same_tenant_turn.stats.prompt_tokens


def test_a_tenant_cannot_store_more_kv_than_its_limit(stack: SecureStack) -> None:
    client = stack.client("full")
    first = client.create_session()
    held = client.chat(first.session_id, "hello world", max_tokens=8).stats.history_tokens
    second = client.create_session()
    # The same first message: its prompt has as many tokens as the first session's had, so
    # it fits the limit alone but not beside the first session.
    max_tokens = KV_LIMIT_TOKENS - held
    with pytest.raises(grpc.RpcError) as error:
        client.chat(second.session_id, "hello world", max_tokens=max_tokens)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_kv_bytes_per_tenant" in error.value.details()
    stack.client("globex").generate("hello world", max_tokens=2)  # other tenants are not affected

    client.delete_session(first.session_id)
    assert client.chat(second.session_id, "hello world", max_tokens=max_tokens).stats.generated_tokens >= 1


def test_callers_without_credentials_are_refused(stack: SecureStack) -> None:
    plaintext = AttnStoreClient(stack.scheduler.address, "key-acme", timeout_seconds=10)
    with plaintext, pytest.raises(grpc.RpcError) as error:
        plaintext.list_sessions()
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    public = ClientCredentials.from_pem(stack.pki.ca.read_bytes())
    no_key = AttnStoreClient(stack.scheduler.address, None, timeout_seconds=10, credentials=public)
    with no_key, pytest.raises(grpc.RpcError) as error:
        no_key.list_sessions()
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_the_worker_takes_calls_only_from_certified_callers(stack: SecureStack) -> None:
    request = worker_pb2.DescribeModelRequest()
    async with aio_channel(stack.worker.address, credentials(stack.pki, cert=True)) as channel:
        reply = await worker_pb2_grpc.WorkerStub(channel).DescribeModel(request, timeout=10)
        assert reply.kv_bytes_per_token == TINY_LLAMA_KV_BYTES_PER_TOKEN
    async with aio_channel(stack.worker.address, credentials(stack.pki, cert=False)) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await worker_pb2_grpc.WorkerStub(channel).DescribeModel(request, timeout=10)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_cli_chats_over_tls_with_an_api_key(stack: SecureStack, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "attnstore_cli.main", "chat", "--address", stack.scheduler.address]
    env = {**os.environ, "ATTNSTORE_HOME": str(tmp_path)}

    def chat(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *flags, "--max-tokens", "4"],
            input="hello world\n/quit\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    secured = chat("--api-key", API_KEYS["chat"], "--ca-file", str(stack.pki.ca))
    assert secured.returncode == 0, secured.stdout + secured.stderr
    assert re.search(r"reused 0 of \d+ prompt tokens", secured.stdout), secured.stdout
    unreadable = chat("--api-key", API_KEYS["chat"], "--ca-file", str(tmp_path / "missing.pem"))
    assert unreadable.returncode == 2 and "--ca-file: cannot read" in unreadable.stdout
    half = chat("--ca-file", str(stack.pki.ca), "--cert-file", str(stack.pki.client_cert))
    assert half.returncode == 2 and "--cert-file and --key-file go together" in half.stdout
