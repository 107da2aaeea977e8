"""Prompt modules through the public API, end to end (a real scheduler with its schemas in
a real Redis, two real workers, a real daemon): RegisterSchema encodes every module with
progress, Generate with a PML prompt serves them (stats: tokens from modules, computed,
repaired), ListSchemas and DeleteSchema, the per-tenant limit, clear errors for bad PML,
and a tenant never reads another's schema or modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from scheduler_stack import RedisFactory, Stack, start_stack

from attnstore.api.v1 import api_pb2 as api

SCHEMA = """<schema name="desk">Notes.<module name="doc">the capital of france is paris and the
capital of italy is rome</module><module name="tone">answer in one word</module></schema>"""
PML = '<prompt schema="desk"><doc/><tone/> what is the capital of france?</prompt>'


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, module_redis_factory: RedisFactory, scheduler_model_dir: Path
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("stack")
    with start_stack(
        root,
        scheduler_model_dir,
        redis=module_redis_factory(),
        scheduler_settings={"max_schemas_per_tenant": 2},
    ) as made:
        yield made


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

    async def pml_and_prompt() -> list[api.GenerateResponse]:  # the SDK cannot send it: the raw stub
        request = api.GenerateRequest(pml=PML, prompt="also")
        return [reply async for reply in client.aio._stub.Generate(request, **client.aio._kwargs())]

    with pytest.raises(grpc.RpcError) as error:
        client.call(pml_and_prompt())
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not both" in error.value.details()
    assert client.delete_schema("desk") and client.delete_schema("desk2")
    with pytest.raises(grpc.RpcError) as error:
        client.generate_pml(PML, max_tokens=4)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
