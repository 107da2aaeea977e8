"""The public API end to end: a real scheduler (sessions in a real Redis) in front of two
real workers on two nodes and a real daemon. Multi-turn chat reuses more KV every turn;
sessions expire and release their KV; tenants never see each other's sessions or KV;
concurrent turns of one session are serialized, in arrival order; health, reflection and metrics answer.
One stack serves the whole module."""

from __future__ import annotations

import asyncio
import itertools
import threading
import urllib.request
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from scheduler_stack import (
    API_KEYS,
    CHUNK_TOKENS,
    Stack,
    StartStack,
    redis_store,
    wait_for,
)
from transformers import PreTrainedTokenizerFast

from attnstore.api.v1 import api_pb2 as api
from attnstore.api.v1 import api_pb2_grpc
from attnstore.api_client import AsyncAttnStoreClient
from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from attnstore.kvstore_client import KVStoreClient
from attnstore_scheduler.redis_turn_queue import queue_key
from inference_worker.model_store import model_digest

SYSTEM = "you are a helpful assistant"
MESSAGES = ["hello world, how are you", "the capital of france is paris", "system user assistant"]
MAX_CONCURRENT_RPCS = 16
SCHEDULER_SETTINGS = {
    "serving": {"max_concurrent_rpcs": MAX_CONCURRENT_RPCS, "overload_retry_after_ms": 250},
    "redis_max_connections": 4,  # fewer than the calls at once: they wait for a connection
    "max_session_tokens": 1500,
    "max_sessions_per_tenant": 4,
    "max_session_ttl_seconds": 600,
    "session_ttl_seconds": 300,
}


@pytest.fixture(scope="module")
def stack(module_stacks: StartStack, scheduler_model_dir: Path) -> Stack:
    settings = {**SCHEDULER_SETTINGS, "metrics_port": 0}
    return module_stacks(scheduler_model_dir, scheduler_settings=settings)


def test_multi_turn_chat_reuses_more_kv_every_turn(stack: Stack) -> None:
    client = stack.client()
    session = client.create_session(system_prompt=SYSTEM)
    assert [m.role for m in session.messages] == [api.ROLE_SYSTEM]

    answers = [client.chat(session.session_id, message, max_tokens=24) for message in MESSAGES]

    reused = [answer.stats.reused_tokens for answer in answers]
    assert reused[0] == 0
    assert 0 < reused[1] < reused[2], reused
    for previous, answer in itertools.pairwise(answers):
        # The new turn's prompt is the previous conversation plus the new message.
        assert answer.stats.prompt_tokens > previous.stats.history_tokens
        # The history closes the answer as the template does (`<|im_end|>\n`; the end-of-turn
        # token is the generation's own when it stopped on it); no turn has run the closing yet.
        closing = 1 if previous.stats.finish_reason == api.FINISH_REASON_STOP else 2
        ran = previous.stats.history_tokens - closing
        # It reuses what the previous turn ran but the last answer token (never fed back, so
        # never computed): the full chunks and the partial one that ends it.
        assert answer.stats.reused_tokens == ran - 1
        assert ran % CHUNK_TOKENS != 1  # so a partial chunk was read
    for answer in answers:
        assert answer.stats.generated_tokens == len(answer.token_ids) >= 1
        assert answer.stats.ttft_ms > 0 and answer.stats.attempts == 1
        assert answer.stats.node in ("node-a", "node-b")
    assert len({answer.stats.node for answer in answers}) == 1  # affinity: the KV's node

    stored = client.get_session(session.session_id)
    assert stored.turns == 3 and stored.history_tokens == answers[-1].stats.history_tokens
    assert [m.content for m in stored.messages] == [
        SYSTEM,
        *(text for message, answer in zip(MESSAGES, answers, strict=True) for text in (message, answer.text)),
    ]
    assert stored.node == answers[-1].stats.node and stored.cached_chunks >= 1


def test_generate_reuses_a_shared_system_prompt_within_a_tenant_only(stack: Stack) -> None:
    long_system = " ".join(["the capital of france is paris"] * 8)
    acme, globex = stack.client("acme"), stack.client("globex")
    first = acme.generate("hello world", system_prompt=long_system, max_tokens=4)
    second = acme.generate("how are you", system_prompt=long_system, max_tokens=4)
    other_tenant = globex.generate("how are you", system_prompt=long_system, max_tokens=4)

    assert first.stats.history_tokens == 0 and first.stats.generated_tokens >= 1
    assert second.stats.reused_tokens >= CHUNK_TOKENS  # the system prompt's chunks
    assert other_tenant.stats.reused_tokens == 0


def test_generate_draws_n_answers_from_one_prompt(stack: Stack) -> None:
    client = stack.client("acme")
    one = client.generate("the capital of france", max_tokens=10)
    greedy = client.generate("the capital of france", max_tokens=10, n=3)
    assert [greedy.samples[i].token_ids for i in range(3)] == [one.token_ids] * 3
    assert greedy.text == one.text and greedy.stats is not None and one.stats is not None
    assert [s.sample_index for s in greedy.stats.samples] == [0, 1, 2]
    assert [s.generated_tokens for s in greedy.stats.samples] == [one.stats.generated_tokens] * 3
    assert greedy.stats.generated_tokens == 3 * one.stats.generated_tokens
    seeded = client.generate("the capital of france", max_tokens=10, n=2, temperature=1.5, seed=8)
    alone = client.generate("the capital of france", max_tokens=10, temperature=1.5, seed=9)
    assert seeded.samples[1].token_ids == alone.token_ids  # answer i is seeded seed + i


def test_a_session_expires_after_its_ttl_and_its_kv_is_released(
    stack: Stack, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    client = stack.client()
    session = client.create_session(system_prompt=SYSTEM, ttl_seconds=2)
    answer = client.chat(session.session_id, MESSAGES[1], max_tokens=16)
    # The keys the worker saved the turn under (prompt and answer but its last token).
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": MESSAGES[1]}],
        add_generation_prompt=True,
        return_dict=False,
    )
    namespace = NamespaceSpec(model_digest(stack.model_dir), "float32", CHUNK_TOKENS, b"acme").namespace_id()
    keys = chunk_key_chain(namespace, [*prompt, *answer.token_ids][:-1], CHUNK_TOKENS)
    assert client.get_session(session.session_id).cached_chunks == len(keys) >= 1
    with KVStoreClient(stack.daemon.address) as daemon:
        wait_for(
            lambda: daemon.lookup(namespace, keys).prefix_length == len(keys), what="the turn's KV saved"
        )
        assert daemon.pin(namespace, keys, ttl_seconds=600) == len(keys)  # as the hint pusher may
        pinned = daemon.stats().pinned_chunks

        wait_for(
            lambda: session.session_id not in {s.session_id for s in client.iter_sessions()}, what="expiry"
        )
        with pytest.raises(grpc.RpcError) as error:
            client.get_session(session.session_id)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        wait_for(lambda: daemon.stats().pinned_chunks == pinned - len(keys), what="the KV unpinned")


def test_tenants_never_see_each_others_sessions(stack: Stack) -> None:
    acme, globex, admin = stack.client("acme"), stack.client("globex"), stack.client("admin")
    session = acme.create_session()
    acme.chat(session.session_id, MESSAGES[0], max_tokens=2)

    calls = {
        "get": lambda: globex.get_session(session.session_id),
        "chat": lambda: globex.chat(session.session_id, "hi", max_tokens=2),
        "delete": lambda: globex.delete_session(session.session_id),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.RpcError) as error:
            call()
        assert error.value.code() == grpc.StatusCode.NOT_FOUND, name
        assert error.value.details() == f"session {session.session_id} not found"
    assert session.session_id not in [s.session_id for s in globex.iter_sessions()]
    with pytest.raises(grpc.RpcError) as error:
        globex.get_session(session.session_id, tenant="acme")
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED

    # The admin key acts on any tenant's sessions.
    assert admin.get_session(session.session_id, tenant="acme").turns == 1
    assert session.session_id in [s.session_id for s in admin.iter_sessions(tenant="acme")]
    admin.delete_session(session.session_id, tenant="acme")
    with pytest.raises(grpc.RpcError) as error:
        acme.get_session(session.session_id)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_concurrent_turns_of_one_session_are_serialized(stack: Stack) -> None:
    client = stack.client()
    session = client.create_session(system_prompt=SYSTEM)
    answers: dict[str, object] = {}

    def turn(message: str) -> None:
        answers[message] = stack.client().chat(session.session_id, message, max_tokens=24)

    threads = [threading.Thread(target=turn, args=(message,)) for message in MESSAGES[:2]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    stored = client.get_session(session.session_id)
    assert stored.turns == 2
    contents = [m.content for m in stored.messages[1:]]
    first, second = (contents[0], contents[2])
    assert {first, second} == set(MESSAGES[:2])  # both turns, whole, one after the other
    later = answers[second]
    assert contents[1] == answers[first].text and contents[3] == later.text  # type: ignore[attr-defined]
    assert later.stats.reused_tokens > 0  # type: ignore[attr-defined]  # it ran on top of the other


async def test_turns_of_one_session_are_stored_in_arrival_order(stack: Stack) -> None:
    """Ten Chat calls queue behind a turn held by another replica (a second store on the same
    Redis); each is sent once the previous one is queued, and they are stored in that order."""
    assert stack.redis is not None
    session_id = stack.client("globex").create_session(system_prompt=SYSTEM).session_id
    messages = [f"message number {number}" for number in range(10)]
    replica = redis_store(stack.redis.url, lock_ttl_seconds=5, lock_wait_seconds=60)
    queue = aioredis.from_url(stack.redis.url)

    async def queued(length: int) -> None:
        async with asyncio.timeout(30):
            while await queue.zcard(queue_key("globex", session_id)) < length:
                await asyncio.sleep(0.01)

    try:
        async with AsyncAttnStoreClient(stack.scheduler.address, API_KEYS["globex"]) as client:
            async with replica.turn_lock("globex", session_id):
                calls = []
                for number, message in enumerate(messages):
                    calls.append(asyncio.create_task(client.chat(session_id, message, max_tokens=4)))
                    await queued(number + 2)
            await asyncio.gather(*calls)
    finally:
        await replica.close()
        await queue.aclose()
    stored = stack.client("globex").get_session(session_id)
    assert [m.content for m in stored.messages if m.role == api.ROLE_USER] == messages


async def test_a_flood_beyond_the_call_limit_is_refused_with_a_retry_hint(stack: Stack) -> None:
    """200 Chat calls at once on one session (each holds a call slot while it waits for the
    session): 16 run, the rest get RESOURCE_EXHAUSTED with a message and retry-after-ms,
    never a bare CANCELLED; health answers throughout; the shedding is logged. Each turn
    writes 32 tokens, so few end while the flood arrives (at 2 tokens, faster engines let 18
    more in than the margin below)."""
    session_id = stack.client("globex").create_session(system_prompt=SYSTEM).session_id
    metadata = (("x-api-key", API_KEYS["globex"]),)
    async with grpc.aio.insecure_channel(stack.scheduler.address) as channel:
        stub = api_pb2_grpc.AttnStoreStub(channel)
        health = health_pb2_grpc.HealthStub(channel)

        async def chat(number: int) -> grpc.aio.AioRpcError | None:
            request = api.ChatRequest(
                session_id=session_id, message=f"flood {number}", options=api.GenerationOptions(max_tokens=32)
            )
            try:
                async for _ in stub.Chat(request, metadata=metadata, timeout=120):
                    pass
            except grpc.aio.AioRpcError as error:
                return error
            return None

        calls = [asyncio.create_task(chat(number)) for number in range(200)]
        probe = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        outcomes = await asyncio.gather(*calls)
    assert probe.status == health_pb2.HealthCheckResponse.SERVING
    refused = [error for error in outcomes if error is not None]
    assert len(refused) >= 200 - 2 * MAX_CONCURRENT_RPCS, len(refused)  # some may start after others end
    for error in refused:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (error.code(), error.details())
        assert "maximum of 16 calls (serving.max_concurrent_rpcs)" in (error.details() or "")
        assert ("retry-after-ms", "250") in tuple(error.trailing_metadata() or ())
    stored = stack.client("globex").get_session(session_id)
    assert stored.turns == 200 - len(refused)  # every admitted turn ran and was saved
    wait_for(lambda: "rpcs_shed" in stack.scheduler.log_tail(400), what="the shedding log line")


def test_ids_list_in_pages_and_the_tenant_limit_holds(stack: Stack) -> None:
    client = stack.client("full")
    made = [client.create_session().session_id for _ in range(4)]
    with pytest.raises(grpc.RpcError) as error:
        client.create_session()
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "holds 4 sessions" in error.value.details()

    page, token = client.list_sessions(page_size=3)
    assert [s.session_id for s in page] == made[:3] and token == made[2]
    rest, token = client.list_sessions(page_size=3, page_token=token)
    assert [s.session_id for s in rest] == made[3:] and token == ""
    assert not page[0].messages  # listing leaves the messages out
    for session_id in made:
        client.delete_session(session_id)
    assert client.list_sessions() == ([], "")


def test_health_reflection_and_metrics(stack: Stack) -> None:
    with grpc.insecure_channel(stack.scheduler.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "attnstore.api.v1.AttnStore"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name for reply in replies for s in reply.list_services_response.service}
        assert "attnstore.api.v1.AttnStore" in names

    stack.client().generate("hello", max_tokens=2)
    url = f"http://127.0.0.1:{stack.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for name in (
        "attnstore_scheduler_queue_length",
        "attnstore_scheduler_queue_wait_seconds_count",
        'attnstore_scheduler_ttft_seconds_count{kind="generate"}',
        'attnstore_scheduler_reused_token_ratio_count{kind="generate"}',
        'attnstore_scheduler_routing_decisions_total{decision="load"}',
        'attnstore_scheduler_turns_total{kind="generate",outcome="ok"}',
        "attnstore_scheduler_healthy_workers 2.0",
    ):
        assert name in text, name
