"""Failures the scheduler rides out, with real processes: a worker killed (SIGKILL) in the
middle of a long answer, Redis restarted or killed (SIGKILL) under the running service,
the daemon killed (SIGKILL) under load. The client still gets one whole answer, no
acknowledged turn is lost, no turn fails for the cache's sake, and the chunks the daemon
had on SSD are served again after its restart."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from chat_load import ChatLoad
from grpc_health.v1 import health_pb2, health_pb2_grpc
from scheduler_stack import Stack, StartStack, wait_for
from service_probes import is_serving, scrape_metrics
from ssd_chunk_files import verified_chunk_files

from attnstore.api.v1 import api_pb2 as api
from attnstore.kvstore_client import KVStoreClient

SYSTEM = "you are a helpful assistant"
LONG_ANSWER_TOKENS = 600
TOKENS_BEFORE_KILL = 10
LOAD_SESSIONS = 4
DAEMON_FALLBACK = 'attnstore_worker_fallbacks_total{reason="daemon_unavailable"}'


@pytest.fixture(scope="module")
def stack(module_stacks: StartStack, scheduler_model_dir: Path) -> Stack:
    return module_stacks(
        scheduler_model_dir,
        persistent_redis=True,
        # A turn lock whose release a Redis crash swallowed holds its session this long.
        scheduler_settings={"session_lock_ttl_seconds": 3},
        worker_metrics=True,
    )


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


def test_a_worker_killed_mid_answer_of_n_samples_still_gives_each_answer_whole(stack: Stack) -> None:
    client = stack.client()
    system, options = "answer in many words", {"max_tokens": 120, "n": 3, "temperature": 1.0, "seed": 21}
    reference = client.generate("how are you", system_prompt=system, **options)
    answers = {i: reference.samples[i].token_ids for i in range(3)}
    assert all(len(tokens) > TOKENS_BEFORE_KILL for tokens in answers.values())

    victim = stack.workers[reference.stats.node]  # affinity sends the same system prompt there
    received: dict[int, list[int]] = {0: [], 1: [], 2: []}
    stats: api.TurnStats | None = None
    for event in client.stream_generate("how are you", system_prompt=system, **options):
        if isinstance(event, api.TurnStats):
            stats = event
            break
        received[event.sample_index].append(event.token_id)
        if sum(map(len, received.values())) == TOKENS_BEFORE_KILL:
            victim.kill9()

    assert stats is not None and stats.attempts == 2 and stats.node != reference.stats.node
    assert received == answers  # each answer whole: none of its tokens lost or repeated
    victim.start()
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


def test_redis_killed_under_load_loses_no_acknowledged_turn(stack: Stack) -> None:
    assert stack.redis is not None
    load = ChatLoad(stack, LOAD_SESSIONS, system_prompt=SYSTEM).start()
    try:
        load.wait_for_turns(2, what="turns before the crash")
        stack.redis.kill9()  # SIGKILL: only what the append-only file fsynced survives
        time.sleep(1.0)  # turns keep coming while Redis is gone
        stack.redis.start()  # same port, same directory: the append-only file is replayed
        load.wait_for_turns(2, since=time.monotonic(), what="turns after the restart")
    finally:
        load.stop()

    assert set(load.refusals) <= {grpc.StatusCode.UNAVAILABLE}, load.refusals
    for loop in load.loops:
        loop.assert_every_acknowledged_turn_stored()
    # Health follows the scheduler's periodic probe of Redis.
    wait_for(lambda: is_serving(stack.scheduler.address), what="health SERVING again", timeout_seconds=10)


def test_redis_killed_mid_turn_the_answer_arrives_and_its_stats_say_it_was_not_saved(stack: Stack) -> None:
    assert stack.redis is not None
    client = stack.client()
    session_id = client.create_session(system_prompt=SYSTEM).session_id
    assert client.chat(session_id, "hello world", max_tokens=4).stats.session_saved
    reference_id = client.create_session(system_prompt=SYSTEM).session_id
    client.chat(reference_id, "hello world", max_tokens=4)
    reference = client.chat(reference_id, "how are you", max_tokens=LONG_ANSWER_TOKENS)
    assert reference.stats.session_saved and len(reference.token_ids) > 2 * TOKENS_BEFORE_KILL

    received: list[api.TokenText] = []
    stats: api.TurnStats | None = None
    started = time.monotonic()
    try:
        for event in client.stream_chat(session_id, "how are you", max_tokens=LONG_ANSWER_TOKENS):
            if isinstance(event, api.TurnStats):
                stats = event
                continue
            received.append(event)
            if len(received) == TOKENS_BEFORE_KILL:
                stack.redis.kill9()
        took = time.monotonic() - started
    finally:
        stack.redis.start()  # the append-only file brings back the sessions as they were

    assert stats is not None and not stats.session_saved  # the whole answer, flagged as not counted
    assert [token.token_id for token in received] == reference.token_ids
    assert took < 30, took
    wait_for(lambda: is_serving(stack.scheduler.address), what="health SERVING again", timeout_seconds=10)
    assert client.get_session(session_id).turns == 1  # as before the turn: send it again
    again = client.chat(session_id, "how are you", max_tokens=LONG_ANSWER_TOKENS)
    assert again.stats.session_saved and again.token_ids == reference.token_ids
    assert client.get_session(session_id).turns == 2


def daemon_fallbacks(stack: Stack) -> float:
    return sum(scrape_metrics(port).get(DAEMON_FALLBACK, 0.0) for port in stack.worker_metrics_ports.values())


def test_a_daemon_killed_under_load_fails_no_turn_and_serves_its_ssd_chunks_again(stack: Stack) -> None:
    load = ChatLoad(stack, LOAD_SESSIONS, system_prompt=SYSTEM).start()
    try:
        load.wait_for_turns(3, what="turns before the crash")
        assert any(turn.stats.reused_tokens for turn in load.turns), "no turn reused KV before the crash"
        fallbacks_before = daemon_fallbacks(stack)
        stack.daemon.kill9()
        killed_at = time.monotonic()
        survivors = verified_chunk_files(stack.daemon.ssd_dir)  # whole, fsynced files only
        load.wait_for_turns(2, since=killed_at, what="turns without the daemon")
        assert daemon_fallbacks(stack) > fallbacks_before  # recomputed, and counted so
        assert not any(t.stats.reused_tokens for t in load.turns if t.acknowledged_at > killed_at + 1)

        stack.daemon.start()  # same port and directories
        restarted_at = time.monotonic()
        wait_for(
            lambda: any(t.stats.reused_tokens for t in load.turns if t.acknowledged_at > restarted_at),
            what="a turn reusing KV again after the restart",
            timeout_seconds=60,
        )
    finally:
        load.stop()

    assert load.refusals == [], "a turn failed because the cache did"
    for loop in load.loops:
        loop.assert_every_acknowledged_turn_stored()
    assert survivors, "no chunk had reached the SSD before the crash"
    with KVStoreClient(stack.daemon.address) as kv:
        for key, (namespace, data) in survivors.items():
            assert kv.get_whole_chunks(namespace, [key]) == [data], f"chunk {key.hex()} was not served"
