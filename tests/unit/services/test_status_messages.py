"""A refusal's message reaches the client whole enough to read, however much of the
request it quotes (a trailer past 8 KiB is dropped by gRPC clients as RESOURCE_EXHAUSTED)."""

from __future__ import annotations

import asyncio

import grpc

from attnstore import errors
from attnstore.server.concurrency import ServingLimits
from attnstore.server.interceptors import MAX_STATUS_MESSAGE_CHARS
from attnstore.server.lifecycle import create_server


async def _refused_with(message: str) -> tuple[grpc.StatusCode, str]:
    async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise errors.NotFound(message)

    server = create_server(ServingLimits())
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("t.S", {"M": grpc.unary_unary_rpc_method_handler(refuse)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                await channel.unary_unary("/t.S/M")(b"", timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
        raise AssertionError("the call was not refused")
    finally:
        await server.stop(None)


def test_a_refusal_quoting_a_huge_request_keeps_its_status_and_the_start_of_its_reason() -> None:
    code, details = asyncio.run(_refused_with("no segment '" + "x" * 300_000 + "'"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert details.startswith("no segment 'xxx") and details.endswith("(300013 characters, cut)")
    assert len(details) < MAX_STATUS_MESSAGE_CHARS + 40


def test_a_short_reason_arrives_unchanged() -> None:
    assert asyncio.run(_refused_with("no session 's1'")) == (grpc.StatusCode.NOT_FOUND, "no session 's1'")
