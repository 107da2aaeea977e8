"""A scheduler without Redis (the embedded session store) runs the basic flow the same
way, and every RPC refuses bad input and bad credentials with the right status and a
message that names the problem; so does a turn whose model has a broken chat template.
One worker, one daemon, one scheduler for the module (and one per broken template)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from scheduler_stack import API_KEYS, Stack, start_stack

from attnstore.api.v1 import api_pb2 as api
from attnstore.api.v1 import api_pb2_grpc
from attnstore.api_client import AsyncAttnStoreClient, AttnStoreClient

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
SETTINGS = {
    "max_message_chars": 200,
    "max_session_tokens": 300,
    "max_session_ttl_seconds": 600,
    "session_ttl_seconds": 300,
}
UNKNOWN_ID = "0" * 32


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, scheduler_model_dir: Path) -> Iterator[Stack]:
    with start_stack(
        tmp_path_factory.mktemp("stack"),
        scheduler_model_dir,
        redis=None,
        worker_nodes=("node-a",),
        scheduler_settings=SETTINGS,
    ) as made:
        yield made


@pytest.fixture(scope="module")
def session_id(stack: Stack) -> str:
    return stack.client().create_session(system_prompt="be brief").session_id


def test_the_embedded_store_runs_the_basic_flow(stack: Stack) -> None:
    client = stack.client()
    session = client.create_session(system_prompt="be brief", ttl_seconds=120)
    assert session.ttl_seconds == 120 and session.expires_at_unix_ms > session.created_at_unix_ms

    first = client.chat(session.session_id, "hello world, how are you", max_tokens=24)
    second = client.chat(session.session_id, "the capital of france is paris", max_tokens=8)
    assert first.stats.reused_tokens == 0 < second.stats.reused_tokens
    assert (first.stats.node, second.stats.node) == ("node-a", "node-a")

    stored = client.get_session(session.session_id)
    assert stored.turns == 2 and len(stored.messages) == 5
    assert session.session_id in [s.session_id for s in client.iter_sessions()]
    assert client.delete_session(session.session_id) == stored.cached_chunks
    with pytest.raises(grpc.RpcError) as error:
        client.get_session(session.session_id)
    assert error.value.code() == NOT_FOUND


def chat(session: str | None = None, message: str = "hi", **options: object) -> Callable[..., object]:
    return lambda client, session_id: client.chat(session or session_id, message, **options)


BAD_REQUESTS: dict[str, tuple[Callable[[AttnStoreClient, str], object], grpc.StatusCode, str]] = {
    "create: long system prompt": (
        lambda c, _: c.create_session(system_prompt="x" * 201),
        INVALID,
        "system_prompt is 201 characters",
    ),
    "create: ttl over the limit": (lambda c, _: c.create_session(ttl_seconds=601), INVALID, "at most 600"),
    "chat: malformed session id": (chat(session="nope"), INVALID, "'nope' is not a session id"),
    "chat: unknown session": (chat(session=UNKNOWN_ID), NOT_FOUND, f"session {UNKNOWN_ID} not found"),
    "chat: id with a trailing newline": (chat(session=UNKNOWN_ID + "\n"), INVALID, "is not a session id"),
    "chat: empty message": (chat(message="  "), INVALID, "message must not be empty"),
    "chat: long message": (chat(message="x" * 201), INVALID, "message is 201 characters"),
    "chat: max_tokens over the model's": (chat(max_tokens=5000), INVALID, "the model allows at most 2048"),
    "chat: negative temperature": (chat(temperature=-1.0), INVALID, "options.temperature"),
    "chat: temperature not a number": (chat(temperature=float("nan")), INVALID, "options.temperature"),
    "chat: temperature infinite": (chat(temperature=float("inf")), INVALID, "options.temperature"),
    "chat: top_p zero": (chat(top_p=0.0), INVALID, "options.top_p"),
    "chat: top_p not a number": (chat(top_p=float("nan")), INVALID, "options.top_p"),
    "chat: max_tokens the largest uint32": (
        chat(max_tokens=2**32 - 1),
        INVALID,
        "the model allows at most 2048",
    ),
    "chat: top_p above one": (chat(top_p=1.5), INVALID, "options.top_p"),
    "chat: session tokens": (chat(max_tokens=290), EXHAUSTED, "limit of 300: start a new session"),
    "chat: expected next turn negative": (
        chat(expected_next_turn_seconds=-1.0),
        INVALID,
        "expected_next_turn_seconds",
    ),
    "chat: expected next turn infinite": (
        chat(expected_next_turn_seconds=float("inf")),
        INVALID,
        "expected_next_turn_seconds must be finite",
    ),
    "chat: expected next turn beyond the longest ttl": (
        chat(expected_next_turn_seconds=601.0),
        INVALID,
        "at most 600 (the longest session TTL)",
    ),
    "chat: over and expected back": (
        chat(expected_next_turn_seconds=5.0, conversation_over=True),
        INVALID,
        "exclude each other",
    ),
    "create: expected first turn not a number": (
        lambda c, _: c.create_session(expected_next_turn_seconds=float("nan")),
        INVALID,
        "expected_next_turn_seconds",
    ),
    "generate: empty prompt": (lambda c, _: c.generate(""), INVALID, "prompt must not be empty"),
    "generate: blank prompt": (lambda c, _: c.generate("\n\t \u3000"), INVALID, "prompt must not be empty"),
    "generate: long prompt": (lambda c, _: c.generate("x" * 201), INVALID, "prompt is 201 characters"),
    "generate: long system prompt": (
        lambda c, _: c.generate("hi", system_prompt="x" * 201),
        INVALID,
        "system_prompt is 201",
    ),
    "generate: temperature too high": (
        lambda c, _: c.generate("hi", temperature=3.0),
        INVALID,
        "in [0, 2.0]",
    ),
    "generate: n over the scheduler's max_samples": (
        lambda c, _: c.generate("hi", n=9),
        INVALID,
        "options.n is 9; at most 8 answers are allowed",
    ),
    "chat: n above one": (chat(n=2), INVALID, "a session's turn keeps one answer"),
    "get: malformed id": (lambda c, _: c.get_session("ABC"), INVALID, "not a session id"),
    "get: unknown id": (lambda c, _: c.get_session(UNKNOWN_ID), NOT_FOUND, "not found"),
    "get: id with a trailing newline": (lambda c, s: c.get_session(s + "\n"), INVALID, "not a session id"),
    "get: another tenant, not admin": (
        lambda c, s: c.get_session(s, tenant="globex"),
        grpc.StatusCode.PERMISSION_DENIED,
        "only admin",
    ),
    "delete: malformed id": (lambda c, _: c.delete_session("x" * 33), INVALID, "not a session id"),
    "delete: unknown id": (lambda c, _: c.delete_session(UNKNOWN_ID), NOT_FOUND, "not found"),
    "delete: id with a trailing newline": (
        lambda c, s: c.delete_session(s + "\n"),
        INVALID,
        "not a session id",
    ),
    "list: page too large": (lambda c, _: c.list_sessions(page_size=1001), INVALID, "at most 1000"),
    "list: malformed page token": (lambda c, _: c.list_sessions(page_token="zz"), INVALID, "page_token"),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_input_is_refused_with_a_clear_status(stack: Stack, session_id: str, case: str) -> None:
    call, code, message = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as error:
        call(stack.client(), session_id)
    assert error.value.code() == code, error.value.details()
    assert message in error.value.details()


@pytest.mark.parametrize("tenant", ["acme\n", "acme\n\n", "\nacme", "ac me"])
def test_an_admin_cannot_name_a_tenant_with_a_newline(stack: Stack, session_id: str, tenant: str) -> None:
    """`acme\n` would be a key space of its own beside `acme`'s (the pattern is anchored)."""
    admin = stack.client("admin")
    for call in (
        lambda: admin.get_session(session_id, tenant=tenant),
        lambda: admin.list_sessions(tenant=tenant),
        lambda: admin.delete_session(session_id, tenant=tenant),
    ):
        with pytest.raises(grpc.RpcError) as error:
            call()
        assert error.value.code() == INVALID and "is not a tenant name" in error.value.details()


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ((), "no API key"),
        ((("x-api-key", "wrong"),), "unknown API key"),
        ((("authorization", "Bearer wrong"),), "unknown API key"),
        ((("authorization", "Basic a2V5"),), "must be 'Bearer <API key>'"),
    ],
    ids=["none", "unknown x-api-key", "unknown bearer", "not bearer"],
)
def test_calls_without_a_known_key_are_unauthenticated(
    stack: Stack, metadata: tuple[tuple[str, str], ...], message: str
) -> None:
    with grpc.insecure_channel(stack.scheduler.address) as channel:
        stub = api_pb2_grpc.AttnStoreStub(channel)
        calls = [
            lambda: stub.CreateSession(api.CreateSessionRequest(), metadata=metadata, timeout=10),
            lambda: list(stub.Chat(api.ChatRequest(session_id=UNKNOWN_ID, message="hi"), metadata=metadata)),
            lambda: list(stub.Generate(api.GenerateRequest(prompt="hi"), metadata=metadata, timeout=10)),
            lambda: stub.GetSession(
                api.GetSessionRequest(session_id=UNKNOWN_ID), metadata=metadata, timeout=10
            ),
            lambda: stub.DeleteSession(api.DeleteSessionRequest(session_id=UNKNOWN_ID), metadata=metadata),
            lambda: stub.ListSessions(api.ListSessionsRequest(), metadata=metadata, timeout=10),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as error:
                call()
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert message in error.value.details()


def test_the_x_api_key_header_names_the_tenant(stack: Stack) -> None:
    with grpc.insecure_channel(stack.scheduler.address) as channel:
        stub = api_pb2_grpc.AttnStoreStub(channel)
        reply = stub.CreateSession(
            api.CreateSessionRequest(), metadata=(("x-api-key", "key-globex"),), timeout=10
        )
    assert reply.session.tenant == "globex"


async def test_the_async_client_streams_the_same_answer(stack: Stack) -> None:
    async with AsyncAttnStoreClient(stack.scheduler.address, API_KEYS["globex"]) as client:
        sessions = [await client.create_session(system_prompt="be brief") for _ in range(2)]
        events = [
            event async for event in client.stream_chat(sessions[0].session_id, "hello world", max_tokens=6)
        ]
        whole = await client.chat(sessions[1].session_id, "hello world", max_tokens=6)
        listed = [session.session_id async for session in client.iter_sessions(page_size=1)]
        assert await client.get_session(sessions[0].session_id, tenant="") is not None

    assert isinstance(events[-1], api.TurnStats) and events[-1].generated_tokens == len(events) - 1
    assert [event.token_id for event in events[:-1]] == whole.token_ids  # greedy: the same answer
    assert {s.session_id for s in sessions} <= set(listed)


# The public API takes no template: the model's own is applied by the worker. One that fails
# is the deployment's problem when it does not parse, the caller's when it refuses a message.
BROKEN_TEMPLATES = {
    "does not parse": (
        "{% for m in messages %}{{ m['content'] }",
        grpc.StatusCode.FAILED_PRECONDITION,
        "the model's chat template is malformed",
    ),
    "refuses the message": (
        (
            "{% for m in messages %}{% if 'forbidden' in m['content'] %}{{ raise_exception('no forbidden words') }}"
            "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
        INVALID,
        "the model's chat template rejected the messages: no forbidden words",
    ),
}


@pytest.mark.parametrize("case", BROKEN_TEMPLATES)
def test_a_chat_template_that_fails_is_a_clear_error_and_stores_nothing(
    tmp_path: Path, scheduler_model_dir: Path, case: str
) -> None:
    template, code, message = BROKEN_TEMPLATES[case]
    model_dir = shutil.copytree(scheduler_model_dir, tmp_path / "model")
    (model_dir / "chat_template.jinja").write_text(template)
    stack = start_stack(tmp_path / "stack", model_dir, redis=None, worker_nodes=("node-a",))
    try:
        client = stack.client()
        system = ["be brief"]
        if code == grpc.StatusCode.FAILED_PRECONDITION:  # no system prompt can be checked in tokens
            with pytest.raises(grpc.RpcError) as error:
                client.create_session(system_prompt="be brief")
            assert error.value.code() == code and message in error.value.details()
            system = []
        session = client.create_session(system_prompt="".join(system))
        calls = [
            lambda: client.chat(session.session_id, "forbidden words", max_tokens=4),
            lambda: client.generate("forbidden words", max_tokens=4),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as error:
                call()
            assert error.value.code() == code, error.value.details()
            assert message in error.value.details()
        stored = client.get_session(session.session_id)
        assert stored.turns == 0 and [m.content for m in stored.messages] == system
        if code == INVALID:  # only that message is refused
            assert client.chat(session.session_id, "hello world", max_tokens=4).stats.generated_tokens > 0
    finally:
        stack.close()
