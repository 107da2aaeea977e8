"""Long contexts with lenders from the pool's ledger only: a scheduler in front of two
workers whose KV pools hold 64 tokens each, no peers list and no peers named by the
scheduler; each lists itself in the ledger (a private Redis, where each worker's daemon
heartbeats too: long_context.pool_redis_url and advertise_address). A chat turn of a few hundred tokens is admitted (up to the
workers' max_context_tokens, which they report) and answered over whichever worker runs
it and the other, found in the ledger, with the same greedy tokens as plain forwards of
the whole sequence; past max_context_tokens the scheduler refuses it before dispatching."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from polling import poll
from scheduler_stack import (
    API_KEYS,
    DAEMON_SETTINGS,
    SCHEDULER_SETTINGS,
    WORKER_SETTINGS,
    RedisFactory,
    Stack,
)
from test_long_context_scheduler_peers import (
    LONG_MESSAGE,
    SYSTEM,
    check_a_long_chat_runs_over_the_other_workers,
)

from attnstore.pool_lenders import read_lenders
from attnstore.server.ports import free_port
from attnstore_cli.local_stack import LocalStack
from attnstore_cli.stack_spec import StackSpec, WorkerSpec

KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 8 * 4  # the tiny Llama: layers x K,V x kv_heads x head_dim x fp32
MAX_CONTEXT_TOKENS = 600
NODES = ("node-a", "node-b")


@pytest.fixture
def stack(tmp_path: Path, redis_factory: RedisFactory, scheduler_model_dir: Path) -> Iterator[Stack]:
    ledger = redis_factory()
    workers = []
    for index, node in enumerate(NODES):
        address = f"127.0.0.1:{free_port()}"
        long_context = {"pool_redis_url": ledger.url, "advertise_address": address,
                        "max_context_tokens": MAX_CONTEXT_TOKENS, "segment_tokens": 64}  # fmt: skip
        settings = {
            "listen_address": address,
            "kv_memory_bytes": 64 * KV_BYTES_PER_TOKEN,
            "long_context": long_context,
        }
        workers.append(WorkerSpec(node, daemon=index, settings=settings))
    daemons = {**DAEMON_SETTINGS, "pool_redis_url": ledger.url, "pool_heartbeat_seconds": 0.5}
    spec = StackSpec(work_dir=tmp_path, model_dir=scheduler_model_dir, daemons=len(NODES), daemon_nodes=NODES,
                     daemon_settings=daemons, workers=tuple(workers), api_keys=API_KEYS,
                     worker_settings=WORKER_SETTINGS, scheduler_settings=SCHEDULER_SETTINGS)  # fmt: skip
    with Stack(LocalStack(spec).start(), scheduler_model_dir, None) as started:
        with redis.Redis.from_url(ledger.url, decode_responses=True) as client:
            addresses = {started.workers[node].address for node in NODES}
            poll(
                lambda: {lender.address for lender in read_lenders(client)} == addresses,
                "both lenders listed",
            )
        yield started


def test_a_chat_longer_than_every_pool_runs_over_the_lenders_of_the_ledger(stack: Stack) -> None:
    check_a_long_chat_runs_over_the_other_workers(stack, NODES)  # the other found in the ledger
    client = stack.client()
    with pytest.raises(grpc.RpcError) as refused:
        client.chat(
            client.create_session(system_prompt=SYSTEM).session_id, " ".join([LONG_MESSAGE] * 4), max_tokens=8
        )
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"a worker serves at most {MAX_CONTEXT_TOKENS}" in (refused.value.details() or "")
