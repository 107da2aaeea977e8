"""attnstore-healthcheck against a real in-process gRPC server with the standard health service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from attnstore.healthcheck import main

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def health_server() -> AsyncIterator[tuple[str, health.aio.HealthServicer]]:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(None)


async def probe(*argv: str) -> int:
    # main() makes a blocking call; run it off the loop that serves the health service.
    return await asyncio.to_thread(main, [*argv, "--timeout-seconds", "5"])


async def test_serving_exits_0_and_not_serving_exits_1(health_server) -> None:
    address, servicer = health_server
    await servicer.set("", SERVING)
    assert await probe("--address", address) == 0
    await servicer.set("", NOT_SERVING)
    assert await probe("--address", address) == 1


async def test_named_service(health_server) -> None:
    address, servicer = health_server
    await servicer.set("attnstore.kvstore.v1.KVStore", SERVING)
    assert await probe("--address", address, "--service", "attnstore.kvstore.v1.KVStore") == 0
    assert await probe("--address", address, "--service", "no.such.Service") == 1


def test_unreachable_server_exits_1() -> None:
    # Nothing listens on port 1 (privileged, unused): the call fails fast with UNAVAILABLE.
    assert main(["--address", "127.0.0.1:1", "--timeout-seconds", "2"]) == 1
