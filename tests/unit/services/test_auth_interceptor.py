"""Internal auth on a server, in process: who gets through, with which status the others
are refused, for every call shape, and health checks stay open."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from attnstore.kvstore.v1 import kvstore_pb2 as pb
from attnstore.kvstore.v1 import kvstore_pb2_grpc
from attnstore.security import InternalAuth, token_digest
from attnstore.server.auth_interceptor import InternalAuthInterceptor
from attnstore.server.concurrency import ServingLimits
from attnstore.server.lifecycle import create_server
from kvstore_daemon.servicer import ADMIN_METHODS

AUTH = InternalAuth(
    enabled=True, token_sha256=(token_digest("worker"),), admin_token_sha256=(token_digest("admin"),)
)
LOOKUP, STATS = "/attnstore.kvstore.v1.KVStore/Lookup", "/attnstore.kvstore.v1.KVStore/Stats"
UNAUTHENTICATED, PERMISSION_DENIED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.mark.parametrize(
    ("client_cert_required", "method", "metadata", "code"),
    [
        (False, LOOKUP, (), UNAUTHENTICATED),
        (False, LOOKUP, bearer("guess"), UNAUTHENTICATED),
        (False, LOOKUP, (("authorization", "Basic d29ya2Vy"),), UNAUTHENTICATED),
        (False, LOOKUP, bearer("worker"), None),
        (False, LOOKUP, bearer("admin"), None),  # an admin token is an internal one too
        (False, STATS, bearer("worker"), PERMISSION_DENIED),
        (False, STATS, bearer("admin"), None),
        (True, LOOKUP, (), None),  # the handshake verified a client certificate
        (True, STATS, (), PERMISSION_DENIED),
        (True, LOOKUP, bearer("guess"), UNAUTHENTICATED),  # a wrong token is never ignored
    ],
)
def test_who_is_refused(
    client_cert_required: bool, method: str, metadata: tuple, code: grpc.StatusCode | None
) -> None:
    interceptor = InternalAuthInterceptor(
        AUTH, client_cert_required=client_cert_required, admin_methods=ADMIN_METHODS
    )
    refusal = interceptor.refusal(method, metadata)
    assert (refusal[0] if refusal else None) == code


class TinyDaemon(kvstore_pb2_grpc.KVStoreServicer):
    """One method of each call shape, answering empty messages."""

    async def Lookup(self, request: pb.LookupRequest, context: grpc.aio.ServicerContext) -> pb.LookupResponse:
        return pb.LookupResponse()

    async def Get(
        self, request: pb.GetRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetResponse]:
        yield pb.GetResponse()

    async def WritePut(
        self, requests: AsyncIterator[pb.WritePutRequest], context: grpc.aio.ServicerContext
    ) -> pb.WritePutResponse:
        async for _ in requests:
            pass
        return pb.WritePutResponse()

    async def Stats(self, request: pb.StatsRequest, context: grpc.aio.ServicerContext) -> pb.StatsResponse:
        return pb.StatsResponse()


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    """To a server with a daemon servicer behind internal auth."""
    server = create_server(
        ServingLimits(),
        interceptors=[InternalAuthInterceptor(AUTH, client_cert_required=False, admin_methods=ADMIN_METHODS)],
    )
    kvstore_pb2_grpc.add_KVStoreServicer_to_server(TinyDaemon(), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as opened:
            yield opened
    finally:
        await server.stop(None)


async def codes(channel: grpc.aio.Channel, metadata: tuple) -> dict[str, grpc.StatusCode]:
    """The status of one call of each shape."""
    stub = kvstore_pb2_grpc.KVStoreStub(channel)

    async def writes() -> AsyncIterator[pb.WritePutRequest]:
        yield pb.WritePutRequest()

    calls = {
        "unary": lambda: stub.Lookup(pb.LookupRequest(), metadata=metadata, timeout=5),
        "server stream": lambda: stub.Get(pb.GetRequest(), metadata=metadata, timeout=5).read(),
        "client stream": lambda: stub.WritePut(writes(), metadata=metadata, timeout=5),
        "admin": lambda: stub.Stats(pb.StatsRequest(), metadata=metadata, timeout=5),
    }
    found = {}
    for shape, call in calls.items():
        try:
            await call()
            found[shape] = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as error:
            found[shape] = error.code()
    return found


async def test_every_call_shape_is_refused_before_its_handler(channel: grpc.aio.Channel) -> None:
    ok = grpc.StatusCode.OK
    assert set((await codes(channel, ())).values()) == {UNAUTHENTICATED}
    assert await codes(channel, bearer("worker")) == {
        "unary": ok,
        "server stream": ok,
        "client stream": ok,
        "admin": PERMISSION_DENIED,
    }
    assert set((await codes(channel, bearer("admin"))).values()) == {ok}


async def test_health_checks_need_no_credential(channel: grpc.aio.Channel) -> None:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
