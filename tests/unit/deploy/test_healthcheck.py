"""attnstore-healthcheck against a real in-process gRPC server with the standard health
service, plaintext and with mutual TLS."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from attnstore.healthcheck import main
from attnstore.security import ServerTLS

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def health_server() -> AsyncIterator[tuple[str, health.aio.HealthServicer]]:
    async with _serve_health(None) as served:
        yield served


@pytest.fixture
async def mtls_health_server(pki) -> AsyncIterator[tuple[str, health.aio.HealthServicer]]:
    tls = ServerTLS(
        cert_file=pki.server_cert, key_file=pki.server_key, client_ca_file=pki.ca, require_client_cert=True
    )
    async with _serve_health(tls.load()) as served:
        yield served


@contextlib.asynccontextmanager
async def _serve_health(
    credentials: grpc.ServerCredentials | None,
) -> AsyncIterator[tuple[str, health.aio.HealthServicer]]:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
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


async def test_mutual_tls(mtls_health_server, pki) -> None:
    address, servicer = mtls_health_server
    await servicer.set("", SERVING)
    tls = ["--address", address, "--tls", "--ca-file", str(pki.ca)]
    client_cert = ["--cert-file", str(pki.client_cert), "--key-file", str(pki.client_key)]
    assert await probe(*tls, *client_cert) == 0
    assert await probe(*tls) == 1  # no client certificate
    assert await probe("--address", address) == 1  # plaintext
    assert await probe(*tls, "--cert-file", str(pki.client_cert)) == 1  # a certificate without its key
