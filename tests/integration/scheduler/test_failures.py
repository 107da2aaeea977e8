"""Failures the scheduler rides out, with real processes: a worker killed (SIGKILL) in the
middle of a long answer, and Redis restarted under the running service. The client still
gets one whole answer, and sessions made before the restart are intact after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from scheduler_stack import RedisFactory, Stack, start_stack, wait_for

from attnstore.api.v1 import api_pb2 as api

SYSTEM = "you are a helpful assistant"
LONG_ANSWER_TOKENS = 600
TOKENS_BEFORE_KILL = 10


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, module_redis_factory: RedisFactory, scheduler_model_dir: Path
) -> Iterator[Stack]:
    redis = module_redis_factory(persistent=True)
    made = start_stack(tmp_path_factory.mktemp("stack"), scheduler_model_dir, redis=redis)
    try:
        yield made
    finally:
        made.close()


def test_a_worker_killed_mid_answer_still_gives_one_whole_answer(stack: Stack) -> None:
    client = stack.client()
    victim_session, reference_session = (client.create_session(system_prompt=SYSTEM) for _ in range(2))
    first = client.chat(victim_session.session_id, "hello world", max_tokens=4)
    assert client.chat(reference_session.session_id, "hello world", max_tokens=4).token_ids == first.token_ids
    reference = client.chat(reference_session.session_id, "how are you", max_tokens=LONG_ANSWER_TOKENS)
    assert len(reference.token_ids) > 2 * TOKENS_BEFORE_KILL  # long enough to kill it midway

    victim = stack.workers[first.stats.node]  # affinity sends the next turn there
    received: list[api.TokenText] = []
    stats: api.TurnStats | None = None
    for event in client.stream_chat(victim_session.session_id, "how are you", max_tokens=LONG_ANSWER_TOKENS):
        if isinstance(event, api.TurnStats):
            stats = event
            break
        received.append(event)
        if len(received) == TOKENS_BEFORE_KILL:
            victim.kill9()

    assert stats is not None
    assert stats.attempts == 2 and stats.node != first.stats.node
    assert [token.token_id for token in received] == reference.token_ids  # no token lost or repeated
    assert "".join(token.text for token in received) == reference.text
    stored = client.get_session(victim_session.session_id)
    assert stored.turns == 2 and stored.messages[-1].content == reference.text
    assert stored.node == stats.node

    victim.start()  # back on its port: the scheduler's health checks take it in again
    wait_for(lambda: client.generate("hello", max_tokens=2).stats.generated_tokens, what="service")


def test_redis_restarted_under_the_service_keeps_every_session(stack: Stack) -> None:
    assert stack.redis is not None
    client = stack.client()
    session = client.create_session(system_prompt=SYSTEM)
    first = client.chat(session.session_id, "hello world", max_tokens=8)

    stack.redis.restart()  # the append-only file is fsynced on every write

    def chat_again() -> api.TurnStats | None:
        try:
            return client.chat(session.session_id, "how are you", max_tokens=8).stats
        except grpc.RpcError as exc:  # while the scheduler reconnects
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
            return None

    second = wait_for(chat_again, what="a turn after the restart")
    assert second.reused_tokens > 0 and second.prompt_tokens > first.stats.history_tokens
    stored = client.get_session(session.session_id)
    assert stored.turns == 2 and stored.messages[1].content == "hello world"
    with grpc.insecure_channel(stack.scheduler.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
