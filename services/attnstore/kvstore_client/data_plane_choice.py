"""Whether a client without shared memory can use the daemon's data plane.

It can when the daemon has one (OpenDataPlane answers a port) and one connection gets
through (its hello answered); otherwise the client stays on gRPC, which every daemon
speaks: a daemon from before the data plane, a port a firewall closes, a TLS mismatch.
"""

from __future__ import annotations

import ssl

import grpc
import structlog

from attnstore.errors import ServiceError
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client.data_plane import DataPlane, TcpDataPlane
from attnstore.security.credentials import ClientCredentials

log = structlog.get_logger("attnstore.kvstore_client")


def daemon_host(address: str) -> str:
    """The host of a gRPC target ("dns:///h:1", "h:1", "[::1]:1")."""
    target = address.rpartition("///")[2]
    return target.rsplit(":", 1)[0].strip("[]")


async def open_data_plane(
    stub: kvstore_pb2_grpc.KVStoreStub,
    address: str,
    credentials: ClientCredentials | None,
    tls: ssl.SSLContext | None,
    timeout_seconds: float,
) -> DataPlane | None:
    try:
        reply = await stub.OpenDataPlane(kvstore_pb2.OpenDataPlaneRequest(), timeout=timeout_seconds)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        return None
    if not reply.port:
        return None
    plane = TcpDataPlane(
        daemon_host(address),
        reply.port,
        ssl_context=(tls or ssl.create_default_context()) if reply.tls else None,
        server_hostname=credentials.server_name if credentials is not None else None,
        token=credentials.token if credentials is not None else None,
        timeout_seconds=timeout_seconds,
    )
    try:
        plane.give_back(await plane.in_thread(plane.connect))
    except (OSError, ServiceError) as exc:
        log.warning("data_plane_unreachable", address=address, port=reply.port, error=str(exc))
        plane.close()
        return None
    return plane
