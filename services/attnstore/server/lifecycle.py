"""Serving lifecycle shared by the services.

Start: bind, register health (SERVING) and reflection, expose Prometheus metrics.
Stop (SIGTERM/SIGINT): health NOT_SERVING, stop accepting, let in-flight calls
finish for `grace_seconds`, then run the service's own cleanup.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Iterable

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from attnstore.server.interceptors import ErrorAndMetricsInterceptor

log = structlog.get_logger("attnstore.server")

# Chunks travel as gRPC messages; the default 4 MiB cap is too small for them.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def create_server() -> grpc.aio.Server:
    return grpc.aio.server(
        interceptors=[ErrorAndMetricsInterceptor()],
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ],
    )


async def serve(
    server: grpc.aio.Server,
    *,
    address: str,
    service_names: Iterable[str],
    metrics_port: int | None,
    grace_seconds: float,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    on_started: Callable[[int], None] | None = None,
) -> None:
    """Runs `server` until SIGTERM or SIGINT; `on_started` receives the bound port."""
    names = list(service_names)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind gRPC address {address}")
    if metrics_port is not None:
        start_http_server(metrics_port)
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    try:
        await server.start()
        for name in ["", *names]:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", address=address, port=port, metrics_port=metrics_port)
        if on_started is not None:
            on_started(port)
        await stop_requested.wait()
        log.info("stopping", grace_seconds=grace_seconds)
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace_seconds)
    finally:
        if on_stop is not None:
            await on_stop()
        log.info("stopped")
