"""The OpenAI-compatible HTTP API against a real stack (a scheduler in front of a real
worker and daemon), through the official `openai` client (sync, async, streaming) and
raw HTTP: answers, streams that concatenate to the whole answer, cached_tokens equal to
the KV reuse the scheduler counts, sessions through X-Attnstore-Session answering as gRPC
Chat does, errors, limits, and a client that disconnects freeing its worker.

One worker with one turn slot: a turn that was not cancelled would hold the slot, so the
disconnect test sees whether the cancelled turn ended."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from scheduler_stack import API_KEYS, CHUNK_TOKENS, RedisFactory, Stack, start_stack, wait_for
from service_probes import free_port

from attnstore.api.v1 import api_pb2 as api

SESSION_HEADER = "X-Attnstore-Session"
SYSTEM = " ".join(["you are a helpful assistant who answers briefly and politely"] * 4)
QUESTIONS = ["hello world, how are you", "the capital of france is paris", "system user assistant"]


@pytest.fixture(scope="module")
def port() -> int:
    """The HTTP API's port."""
    return free_port()


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    module_redis_factory: RedisFactory,
    scheduler_model_dir: Path,
    port: int,
) -> Iterator[Stack]:
    settings = {
        "openai_listen_address": f"127.0.0.1:{port}",
        "openai_max_request_bytes": 64 * 1024,
        "max_turns_per_worker": 1,
        "max_queue_length": 1,
        "max_message_chars": 20_000,
    }
    with start_stack(
        tmp_path_factory.mktemp("stack"),
        scheduler_model_dir,
        redis=module_redis_factory(),
        worker_nodes=("node-a",),
        scheduler_settings=settings,
        worker_metrics=True,
    ) as made:
        yield made
        # SIGTERM: both servers drain and the scheduler exits cleanly.
        assert made.scheduler.stop() == 0, made.scheduler.log_tail()


def base_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def client(stack: Stack, port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url(port), api_key=API_KEYS["acme"], max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def raw(
    port: int, method: str, path: str, body: object = None, *, key: str | None = "key-acme", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one plain HTTP request."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    payload = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    sent = {"content-type": "application/json", **headers}
    if key is not None:
        sent["authorization"] = f"Bearer {key}"
    connection.request(method, path, body=payload, headers=sent)
    response = connection.getresponse()
    result = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    connection.close()
    return result


def metric(port: int, name: str) -> float:
    """The sum of a Prometheus metric's samples (every label set)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


def chat(system: str, *turns: str) -> list[dict[str, str]]:
    """A conversation: the system message, then user and assistant messages alternating."""
    roles = ["user", "assistant"]
    return [{"role": "system", "content": system}] + [
        {"role": roles[index % 2], "content": text} for index, text in enumerate(turns)
    ]


def test_models_health_and_metrics_answer(port: int, client: openai.OpenAI, model: str) -> None:
    assert [m.id for m in client.models.list().data] == [model]
    assert client.models.retrieve(model).id == model
    status, _, body = raw(port, "GET", "/health", key=None)
    assert status == 200 and json.loads(body) == {"status": "ok", "model": model}
    assert metric(port, "attnstore_openai_requests_total") >= 2


def test_streamed_chunks_concatenate_to_the_whole_greedy_answer(client: openai.OpenAI, model: str) -> None:
    messages = chat("be brief", QUESTIONS[0])
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=24)
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)

    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.object == "chat.completion" and whole.model == model
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    usage = chunks[-1].usage  # include_usage: a last chunk without choices
    assert chunks[-1].choices == [] and usage is not None
    assert usage.prompt_tokens == whole.usage.prompt_tokens > 0
    assert usage.completion_tokens == whole.usage.completion_tokens >= 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_n_choices_come_from_one_prompt_whole_and_streamed(client: openai.OpenAI, model: str) -> None:
    messages = chat("be brief", QUESTIONS[1])
    one = client.chat.completions.create(model=model, messages=messages, max_tokens=12)
    greedy = client.chat.completions.create(model=model, messages=messages, max_tokens=12, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert [c.message.content for c in greedy.choices] == [one.choices[0].message.content] * 3
    assert greedy.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert greedy.usage.prompt_tokens == one.usage.prompt_tokens

    sampled = {
        "model": model,
        "prompt": QUESTIONS[2],
        "max_tokens": 12,
        "n": 2,
        "temperature": 1.5,
        "seed": 3,
    }
    whole = client.completions.create(**sampled)
    chunks = list(client.completions.create(**sampled, stream=True))
    streamed = [
        "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in (0, 1)
    ]
    assert streamed == [choice.text for choice in whole.choices]  # seeded: the same answers
    finishes = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(c.index for c in finishes) == [0, 1]
    alone = client.completions.create(**{**sampled, "n": 1, "seed": 4})
    assert whole.choices[1].text == alone.choices[0].text  # answer i is seeded seed + i


def test_async_client_chat_and_completions_stream_as_they_answer(port: int, model: str) -> None:
    async def run() -> None:
        client = openai.AsyncOpenAI(
            base_url=base_url(port), api_key=API_KEYS["acme"], max_retries=0, timeout=120
        )
        async with client:
            messages = chat("be brief", QUESTIONS[1])
            whole = await client.chat.completions.create(model=model, messages=messages, max_tokens=16)
            stream = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=16, stream=True
            )
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            assert streamed == whole.choices[0].message.content

            completion = await client.completions.create(model=model, prompt="the capital of", max_tokens=12)
            assert completion.object == "text_completion" and completion.usage is not None
            assert completion.usage.prompt_tokens >= 3
            pieces = await client.completions.create(
                model=model, prompt="the capital of", max_tokens=12, stream=True
            )
            streamed = "".join([c.choices[0].text async for c in pieces if c.choices])
            assert streamed == completion.choices[0].text and streamed

    asyncio.run(run())


def test_stop_texts_end_the_answer_and_are_left_out(stack: Stack, client: openai.OpenAI, model: str) -> None:
    messages = chat("be brief", QUESTIONS[2])
    full = (
        client.chat.completions.create(model=model, messages=messages, max_tokens=40)
        .choices[0]
        .message.content
    )
    assert full is not None and len(full) >= 8
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    expected = full[: full.index(stop)]

    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=40, stop=[stop, "\x00zz"]
    )
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=40, stop=stop, stream=True
    )
    chunks = [c for c in stream if c.choices]

    assert whole.choices[0].message.content == expected and whole.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    # gRPC's stop texts end the answer the same way; its tokens include the stop text.
    grpc_answer = stack.client().generate(QUESTIONS[2], system_prompt="be brief", max_tokens=40, stop=[stop])
    assert grpc_answer.text.startswith(expected + stop) and len(grpc_answer.text) < len(full)
    assert grpc_answer.stats.finish_reason == api.FINISH_REASON_STOP_STRING  # gRPC says which stop


def test_a_resent_conversation_reports_its_reused_kv_as_cached_tokens(
    port: int, client: openai.OpenAI, model: str
) -> None:
    first = client.chat.completions.create(model=model, messages=chat(SYSTEM, QUESTIONS[0]), max_tokens=16)
    assert first.usage.prompt_tokens >= 2 * CHUNK_TOKENS
    answer = first.choices[0].message.content or ""
    reused_before = metric(port, "attnstore_scheduler_reused_tokens_total")

    second = client.chat.completions.create(
        model=model, messages=chat(SYSTEM, QUESTIONS[0], answer, QUESTIONS[1]), max_tokens=16
    )

    cached = second.usage.prompt_tokens_details.cached_tokens
    # The first request's prompt chunks (the whole ones) come back: the tokens agree that far.
    assert cached >= first.usage.prompt_tokens // CHUNK_TOKENS * CHUNK_TOKENS > 0
    assert cached == metric(port, "attnstore_scheduler_reused_tokens_total") - reused_before


def test_the_session_header_answers_as_grpc_chat_on_the_same_messages(
    stack: Stack, client: openai.OpenAI, model: str
) -> None:
    grpc_client = stack.client("acme")
    session = grpc_client.create_session(system_prompt=SYSTEM)
    expected = [grpc_client.chat(session.session_id, q, max_tokens=16) for q in QUESTIONS]

    header, history, answers, usages = "new", [], [], []
    for index, question in enumerate(QUESTIONS):
        history.append({"role": "user", "content": question})
        streamed = index == 1  # a session turn streams as well
        reply = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "system", "content": SYSTEM}, *history],
            max_tokens=16,
            extra_headers={SESSION_HEADER: header},
            stream=streamed,
            stream_options={"include_usage": True} if streamed else None,
        )
        header = reply.headers[SESSION_HEADER]
        if streamed:
            chunks = list(reply.parse())
            answers.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
            usages.append(chunks[-1].usage)
        else:
            completion = reply.parse()
            answers.append(completion.choices[0].message.content)
            usages.append(completion.usage)
        history.append({"role": "assistant", "content": answers[-1]})

    assert answers == [answer.text for answer in expected]
    # Later turns reuse the session's own history, all but its last token, as in gRPC (the
    # first turns may differ: the gRPC one ran first and left its prompt's chunks behind).
    assert [u.prompt_tokens_details.cached_tokens for u in usages[1:]] == [
        a.stats.reused_tokens for a in expected[1:]
    ]
    # The whole first prompt and answer but the answer's last token (the template's closing
    # after it is computed with the new message).
    first = expected[0].stats
    assert usages[1].prompt_tokens_details.cached_tokens == first.prompt_tokens + first.generated_tokens - 1
    assert [u.prompt_tokens for u in usages] == [a.stats.prompt_tokens for a in expected]
    assert grpc_client.get_session(header).turns == len(QUESTIONS)


def test_errors_are_openai_shaped_with_the_right_status(
    stack: Stack, port: int, client: openai.OpenAI, model: str
) -> None:
    user = [{"role": "user", "content": "hi"}]
    wrong_key = openai.OpenAI(base_url=base_url(port), api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as bad_key:
        wrong_key.chat.completions.create(model=model, messages=user)
    assert bad_key.value.status_code == 401 and bad_key.value.code == "invalid_api_key"

    status, _, body = raw(port, "POST", "/v1/chat/completions", {"model": model, "messages": user}, key=None)
    error = json.loads(body)["error"]
    assert status == 401 and error["type"] == "authentication_error" and "Bearer" in error["message"]

    with pytest.raises(openai.NotFoundError) as unknown_model:
        client.chat.completions.create(model="gpt-4o", messages=user)
    assert unknown_model.value.code == "model_not_found" and model in unknown_model.value.message

    with pytest.raises(openai.BadRequestError) as many_choices:
        client.chat.completions.create(model=model, messages=user, n=9)
    assert "options.n is 9; at most 8 answers" in many_choices.value.message
    with pytest.raises(openai.BadRequestError) as session_choices:
        client.chat.completions.create(model=model, messages=user, n=2, extra_headers={SESSION_HEADER: "new"})
    assert "keeps one answer" in session_choices.value.message

    for bad, field in (
        ({"model": model}, "messages"),
        ({"model": model, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"model": model, "messages": user, "temperature": 7}, "temperature"),
        ({"model": model, "messages": user, "max_tokens": 100_000}, "max_tokens"),
        ({"model": model, "messages": user, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": model, "prompt": "x", "echo": True}, "echo"),
    ):
        path = "/v1/completions" if "prompt" in bad else "/v1/chat/completions"
        status, _, body = raw(port, "POST", path, bad)
        error = json.loads(body)["error"]
        assert status == 400 and error["type"] == "invalid_request_error" and field in error["message"], body
    status, _, body = raw(port, "POST", "/v1/chat/completions", b"{not json")
    assert status == 400 and "error" in json.loads(body)

    huge = {"model": model, "messages": [{"role": "user", "content": "x" * 70_000}]}
    status, _, body = raw(port, "POST", "/v1/chat/completions", huge)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"

    status, _, body = raw(
        port,
        "POST",
        "/v1/chat/completions",
        {"model": model, "messages": user},
        **{SESSION_HEADER: "0" * 32},
    )
    assert status == 404 and json.loads(body)["error"]["type"] == "not_found_error"
    # Options are checked before a new session is made: none is left behind.
    sessions = len(list(stack.client().iter_sessions()))
    too_long = {"model": model, "messages": user, "max_tokens": 100_000}
    assert raw(port, "POST", "/v1/chat/completions", too_long, **{SESSION_HEADER: "new"})[0] == 400
    assert len(list(stack.client().iter_sessions())) == sessions
    assistant_last = [*user, {"role": "assistant", "content": "hello"}]
    status, _, body = raw(
        port,
        "POST",
        "/v1/chat/completions",
        {"model": model, "messages": assistant_last},
        **{SESSION_HEADER: "new"},
    )
    assert status == 400 and "last message" in json.loads(body)["error"]["message"]


@pytest.mark.usefixtures("stack")
def test_a_tenant_over_its_rate_gets_429_with_retry_after(port: int) -> None:
    for _ in range(1000):
        status, headers, body = raw(port, "GET", "/v1/models", key="key-globex")
        if status != 200:
            break
    assert status == 429, body
    assert json.loads(body)["error"]["code"] == "rate_limit_exceeded" and int(headers["retry-after"]) >= 1


def test_a_full_queue_answers_429_with_retry_after(port: int, model: str) -> None:
    long_turn = {"model": model, "messages": [{"role": "user", "content": "go on"}], "max_tokens": 2000}
    headers = {"authorization": "Bearer key-acme", "content-type": "application/json"}
    running, queued = (http.client.HTTPConnection("127.0.0.1", port, timeout=60) for _ in range(2))
    try:
        running.request("POST", "/v1/chat/completions", json.dumps({**long_turn, "stream": True}), headers)
        assert running.getresponse().readline().startswith(b"data: ")  # it holds the one slot
        queued.request("POST", "/v1/chat/completions", json.dumps(long_turn), headers)
        wait_for(lambda: metric(port, "attnstore_scheduler_queue_length") == 1, what="the queued turn")

        status, reply_headers, body = raw(port, "POST", "/v1/chat/completions", long_turn)
        assert status == 429 and reply_headers["retry-after"] == "1", body
        assert json.loads(body)["error"]["code"] == "queue_full"
    finally:
        running.close()
        queued.close()
    wait_for(lambda: metric(port, "attnstore_scheduler_queue_length") == 0, what="the queued turn cancelled")


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_cancels_its_turn(
    stack: Stack, port: int, model: str, stream: bool
) -> None:
    worker_port = stack.worker_metrics_ports["node-a"]
    turns_before = metric(worker_port, "attnstore_worker_turns_total")
    disconnects_before = metric(port, "attnstore_openai_client_disconnects_total")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "go on"}],
        "max_tokens": 2000,
        "stream": stream,
    }
    headers = {"authorization": "Bearer key-acme", "content-type": "application/json"}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    if stream:
        response = connection.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")
    connection.close()  # mid-answer (or before it)
    wait_for(
        lambda: metric(port, "attnstore_openai_client_disconnects_total") > disconnects_before,
        what="the disconnect",
    )

    # The worker's only slot is free again (a turn still running would hold it), and the
    # cancelled turn never completed: only this one counts.
    short = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert raw(port, "POST", "/v1/chat/completions", short)[0] == 200
    assert metric(worker_port, "attnstore_worker_turns_total") == turns_before + 1
