"""Prompt modules through the public API, end to end (a real scheduler with its schemas in
a real Redis, two real workers, a real daemon): RegisterSchema encodes every module with
progress, Generate with a PML prompt serves them (stats: tokens from modules, computed,
repaired), ListSchemas and DeleteSchema, the per-tenant limit, clear errors for bad PML,
and a tenant never reads another's schema or modules; the repair options on the wire; a
chat session that starts from a PML prompt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from scheduler_stack import CHUNK_TOKENS, Stack, StartStack

from attnstore.api.v1 import api_pb2 as api
from attnstore.api.v1.api_pb2_grpc import AttnStoreStub
from attnstore.api_client import AttnStoreClient

SCHEMA = """<schema name="desk">Notes.<module name="doc">the capital of france is paris and the
capital of italy is rome</module><module name="tone">answer in one word</module></schema>"""
PML = '<prompt schema="desk"><doc/><tone/> what is the capital of france?</prompt>'


@pytest.fixture(scope="module")
def stack(module_stacks: StartStack, scheduler_model_dir: Path) -> Stack:
    return module_stacks(scheduler_model_dir, scheduler_settings={"max_schemas_per_tenant": 2})


def raw(client: AttnStoreClient, rpc: Callable[[AttnStoreStub], Any], request: Message) -> list[Any]:
    """A request the SDK would not build, sent through the async client's stub on its loop."""

    async def send() -> list[Any]:
        return [reply async for reply in rpc(client.aio._stub)(request, **client.aio._kwargs())]

    return client.call(send())


def test_a_registered_schema_serves_pml_prompts_from_its_modules(stack: Stack) -> None:
    client = stack.client("acme")
    events = list(client.stream_register_schema(SCHEMA))
    progress, info = events[:-1], events[-1]
    assert isinstance(info, api.SchemaInfo) and info.name == "desk" and info.modules == 2
    assert [(p.done, p.total, p.module) for p in progress] == [
        (1, 3, "(root)"),
        (2, 3, "doc"),
        (3, 3, "tone"),
    ]
    assert all(p.encoded for p in progress)
    assert [s.name for s in client.list_schemas()] == ["desk"]

    answer = client.generate_pml(PML, max_tokens=6)
    stats = answer.stats
    assert stats.generated_tokens == len(answer.token_ids) >= 1
    assert stats.module_tokens == stats.reused_tokens > 0 and stats.encoded_modules == 0
    assert stats.computed_tokens == stats.prompt_tokens - stats.reused_tokens > 0
    repaired = client.generate_pml(PML, repair_tokens=2, max_tokens=6).stats
    assert repaired.repaired_tokens == 4 and repaired.computed_tokens == stats.computed_tokens + 4

    # Registering again replaces it; the modules are stored already.
    assert not any(
        p.encoded for p in client.stream_register_schema(SCHEMA) if isinstance(p, api.SchemaEncodeProgress)
    )


def test_a_tenant_never_reads_another_tenants_schema_or_modules(stack: Stack) -> None:
    stack.client("acme").register_schema(SCHEMA)
    globex = stack.client("globex")
    with pytest.raises(grpc.RpcError) as error:
        globex.generate_pml(PML, max_tokens=4)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND and "desk" in error.value.details()
    assert globex.list_schemas() == []
    assert not globex.delete_schema("desk")
    # Its own copy of the same schema is encoded again, in its own namespace.
    progress = [p for p in globex.stream_register_schema(SCHEMA) if isinstance(p, api.SchemaEncodeProgress)]
    assert progress and all(p.encoded for p in progress)
    assert globex.delete_schema("desk")


def test_limits_and_bad_pml_are_clear_errors(stack: Stack) -> None:
    client = stack.client("full")
    client.register_schema(SCHEMA)
    client.register_schema(SCHEMA.replace('"desk"', '"desk2"'))
    with pytest.raises(grpc.RpcError) as error:
        client.register_schema(SCHEMA.replace('"desk"', '"desk3"'))
    assert (
        error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        and "max_schemas_per_tenant" in error.value.details()
    )
    cases = [
        (
            lambda: client.register_schema(
                "<schema name='x'><module name='a'>x</module><module name='a'/></schema>"
            ),
            "line 1",
        ),
        (lambda: client.register_schema("<schema"), "line 1"),
        (lambda: client.generate_pml('<prompt schema="desk"><nope/></prompt>', max_tokens=4), "nope"),
    ]
    for call, message in cases:
        with pytest.raises(grpc.RpcError) as error:
            call()
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
        assert message in error.value.details()

    with pytest.raises(grpc.RpcError) as error:  # the SDK cannot send it: the raw stub
        raw(client, lambda stub: stub.Generate, api.GenerateRequest(pml=PML, prompt="also"))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not both" in error.value.details()
    assert client.delete_schema("desk") and client.delete_schema("desk2")
    with pytest.raises(grpc.RpcError) as error:
        client.generate_pml(PML, max_tokens=4)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_repair_options_reach_the_worker(stack: Stack) -> None:
    client = stack.client("acme")
    client.register_schema(SCHEMA)
    whole = client.generate_pml(PML, repair_fraction=1.0, max_tokens=2).stats
    half = client.generate_pml(PML, repair_fraction=0.5, repair_method="first", max_tokens=2).stats
    chosen = client.generate_pml(PML, repair_fraction=0.5, repair_method="deviation", max_tokens=2).stats
    assert 0 < whole.repaired_tokens < whole.module_tokens  # doc and tone; the root, first, never
    assert whole.repaired_tokens / 2 - 1 <= half.repaired_tokens <= whole.repaired_tokens / 2  # rounded down
    assert chosen.repaired_tokens == half.repaired_tokens


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pml": PML, "repair_fraction": 1.5}, "repair_fraction is 1.5"),
        ({"pml": PML, "repair_fraction": float("nan")}, "repair_fraction is nan"),
        ({"pml": PML, "repair_fraction": float("inf")}, "repair_fraction is inf"),
        ({"pml": PML, "repair_tokens": 2, "repair_fraction": 0.1}, "not both"),
        ({"pml": PML, "repair_method": 7, "repair_tokens": 2}, "repair_method 7"),
        ({"pml": PML, "repair_method": api.REPAIR_METHOD_DEVIATION}, "needs a repair budget"),
        ({"pml": PML, "repair_tokens": 5000}, "repair_tokens is 5000"),
        ({"prompt": "hi", "repair_tokens": 2}, "repair_tokens apply to pml prompts only"),
        (
            {"prompt": "hi", "repair_fraction": 0.1, "add_generation_prompt": True},
            "repair_fraction, add_generation_prompt apply",
        ),
        ({"prompt": "hi", "repair_method": api.REPAIR_METHOD_FIRST}, "repair_method apply"),
    ],
    ids=[
        "fraction",
        "nan",
        "inf",
        "both",
        "unknown method",
        "no budget",
        "tokens",
        "no pml",
        "two",
        "method",
    ],
)
def test_bad_repair_options_are_invalid_argument(stack: Stack, fields: dict[str, Any], message: str) -> None:
    client = stack.client("acme")
    client.register_schema(SCHEMA)
    request = api.GenerateRequest(options=api.GenerationOptions(max_tokens=2), **fields)
    with pytest.raises(grpc.RpcError) as error:
        raw(client, lambda stub: stub.Generate, request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    assert message in error.value.details()
    chat = api.ChatRequest(session_id=client.create_session().session_id, **fields_for_chat(fields))
    with pytest.raises(grpc.RpcError) as error:
        raw(client, lambda stub: stub.Chat, chat)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    assert message.replace(", add_generation_prompt", "") in error.value.details()


def fields_for_chat(fields: dict[str, Any]) -> dict[str, Any]:
    """The Generate fields as a Chat request's (a message for a prompt; Chat always opens
    the answer, so it has no add_generation_prompt)."""
    chat = {key: value for key, value in fields.items() if key not in ("prompt", "add_generation_prompt")}
    return chat | ({"message": fields["prompt"]} if "prompt" in fields else {})


def test_a_session_starts_from_a_pml_prompt_and_goes_on_as_usual(stack: Stack) -> None:
    client = stack.client("acme")
    client.register_schema(SCHEMA)
    session = client.create_session().session_id
    first = client.chat_pml(session, PML, max_tokens=6)
    stats = first.stats
    assert stats.module_tokens == stats.reused_tokens > 0 and stats.session_saved
    # The same prompt as a one-off with the answer's opening: the same greedy answer.
    assert client.generate_pml(PML, add_generation_prompt=True, max_tokens=6).token_ids == first.token_ids
    stored = client.get_session(session)
    assert stored.turns == 1 and [m.content for m in stored.messages] == [PML, first.text]
    assert stored.history_tokens == stats.history_tokens >= stats.prompt_tokens + len(first.token_ids)

    # Later turns are plain messages: the first computes the history in full (module KV is
    # never stored as a prefix's) and saves it; the next reuses it.
    second = client.chat(session, "and of italy?", max_tokens=4).stats
    assert second.module_tokens == 0 and second.prompt_tokens > stored.history_tokens
    third = client.chat(session, "thanks", max_tokens=4).stats
    assert third.reused_tokens >= second.prompt_tokens - CHUNK_TOKENS

    with pytest.raises(grpc.RpcError) as error:
        client.chat_pml(session, PML, max_tokens=4)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "only start" in error.value.details()
    framed = client.create_session(system_prompt="be brief").session_id
    with pytest.raises(grpc.RpcError) as error:
        client.chat_pml(framed, PML, max_tokens=4)
    assert (
        error.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "system prompt" in error.value.details()
    )
    with pytest.raises(grpc.RpcError) as error:
        raw(client, lambda stub: stub.Chat, api.ChatRequest(session_id=framed, message="hi", pml=PML))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not both" in error.value.details()
    with pytest.raises(grpc.RpcError) as error:
        client.chat_pml(client.create_session().session_id, '<prompt schema="nope"/>', max_tokens=4)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
