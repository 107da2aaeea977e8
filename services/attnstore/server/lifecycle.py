"""Serving lifecycle shared by the services.

Start: bind (with TLS when given server credentials), register health and reflection,
optionally serve health alone on a plaintext port (`health_address`: Kubernetes' gRPC
probes speak no TLS, so under TLS, and mutual TLS above all, they cannot reach the main
port), expose Prometheus metrics; health turns SERVING only once the server runs and the
service's health probe (if any) has passed. While serving, the probe runs again every
`health_probe_interval_seconds` and health follows it. Stop (SIGTERM/SIGINT): health
NOT_SERVING, stop accepting, let in-flight calls finish for `grace_seconds`, then run the
service's own cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from attnstore.server.concurrency import ConcurrencyLimit, ServingLimits
from attnstore.server.interceptors import ErrorAndMetricsInterceptor
from attnstore.server.service_settings import ServiceSettings

log = structlog.get_logger("attnstore.server")

# Chunks travel as gRPC messages; the default 4 MiB cap is too small for them.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Raises when the service cannot do its work (a device that fails a tiny operation).
HealthProbe = Callable[[], Awaitable[None]]


def create_server(
    limits: ServingLimits, *, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
) -> grpc.aio.Server:
    """`interceptors` run before the shared one, first outermost (internal auth refuses a
    call before any handler sees it). `limits`: the service's `serving` settings."""
    return grpc.aio.server(
        interceptors=[*interceptors, ErrorAndMetricsInterceptor(ConcurrencyLimit(limits))],
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            # Calls the transport accepted that the server loop has not taken up yet: gRPC
            # core drops them as a bare CANCELLED, with no log line, beyond 1,000 (at random;
            # all beyond 3,000) or after 30 s. Kept instead, each reaches the concurrency
            # limit and is refused with a message, or runs (a flood of 10,000 Chat calls on 2
            # cores took 85 s to take up).
            ("grpc.server.max_pending_requests", limits.max_pending_rpcs),
            ("grpc.server.max_pending_requests_hard_limit", limits.max_pending_rpcs),
            ("grpc.server_max_unrequested_time_in_server", limits.max_pending_seconds),
        ],
    )


async def serve(
    server: grpc.aio.Server,
    settings: ServiceSettings,
    *,
    service_names: Iterable[str],
    on_stop: Callable[[], Awaitable[None]] | None = None,
    on_stopping: Callable[[], None] | None = None,
    on_started: Callable[[int], None] | None = None,
    health_probe: HealthProbe | None = None,
    health_probe_interval_seconds: float = 0.0,
    credentials: grpc.ServerCredentials | None = None,
) -> None:
    """Runs `server` at `settings.listen_address` until SIGTERM or SIGINT, then gives
    in-flight calls `settings.shutdown_grace_seconds`; `on_started` receives the bound
    port, which then goes to `settings.ready_file`.

    `health_probe` must pass once before anything reports SERVING (its failure ends
    serve() with that exception); with a positive interval it runs again periodically.
    `credentials` (attnstore.security.ServerTLS.load()): TLS; None: plaintext. `on_stopping`
    runs when the stop begins, so another server of the service drains during the same grace.
    `settings.tls.health_listen_address`: host:port of a plaintext server with the health
    service only, following the same statuses; None: none."""
    address, metrics_port = settings.listen_address, settings.metrics_port
    grace_seconds, health_address = settings.shutdown_grace_seconds, settings.tls.health_listen_address
    names = ["", *service_names]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*names[1:], health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise OSError(f"could not bind gRPC address {address}")
    health_server = _health_only_server(health_servicer, health_address) if health_address else None
    if metrics_port is not None:  # 0: any free port, the one bound goes to the log and the ready file
        metrics_server, _ = start_http_server(metrics_port)
        metrics_port = metrics_server.server_port
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    if settings.parent_watch_fd is not None:
        _stop_when_parent_dies(loop, settings.parent_watch_fd, stop_requested)
    watcher: asyncio.Task[None] | None = None
    try:
        await _set_all(health_servicer, names, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        if health_server is not None:
            await health_server.start()
        if health_probe is not None:
            try:
                await health_probe()
            except BaseException:
                await server.stop(0)
                raise
        await _set_all(health_servicer, names, health_pb2.HealthCheckResponse.SERVING)
        tls = credentials is not None
        log.info(
            "serving",
            address=address,
            port=port,
            metrics_port=metrics_port,
            tls=tls,
            health_address=health_address,
        )
        if on_started is not None:
            on_started(port)
        write_ready_file(settings.ready_file, port, metrics_port)
        if health_probe is not None and health_probe_interval_seconds > 0:
            watcher = loop.create_task(
                _watch_health(health_servicer, names, health_probe, health_probe_interval_seconds)
            )
        await stop_requested.wait()
        log.info("stopping", grace_seconds=grace_seconds)
        if on_stopping is not None:
            on_stopping()
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace_seconds)
    finally:
        if health_server is not None:
            await health_server.stop(0)
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if on_stop is not None:
            await on_stop()
        log.info("stopped")


def _stop_when_parent_dies(loop: asyncio.AbstractEventLoop, fd: int, stop_requested: asyncio.Event) -> None:
    """The parent holds the pipe's only write end: end of file means it is gone (a local
    stack killed with SIGKILL would otherwise leave its services running as orphans)."""

    def on_readable() -> None:
        if os.read(fd, 4096):
            return
        loop.remove_reader(fd)
        log.warning("parent_process_gone", fd=fd)
        stop_requested.set()

    loop.add_reader(fd, on_readable)


def _health_only_server(health_servicer: health.aio.HealthServicer, address: str) -> grpc.aio.Server:
    """A plaintext server answering grpc.health.v1 and nothing else (no credential is
    asked, none is needed: it tells only SERVING or not)."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"could not bind the health address {address}")
    return server


async def _set_all(
    health_servicer: health.aio.HealthServicer,
    names: list[str],
    status: health_pb2.HealthCheckResponse.ServingStatus,
) -> None:
    for name in names:
        await health_servicer.set(name, status)


async def _watch_health(
    health_servicer: health.aio.HealthServicer, names: list[str], probe: HealthProbe, interval_seconds: float
) -> None:
    """Re-runs `probe` forever; health follows its result (logged when it changes)."""
    healthy = True
    while True:
        await asyncio.sleep(interval_seconds)
        try:
            await probe()
        except Exception as exc:  # noqa: BLE001 -- any failure means "not serving"
            if healthy:
                log.error("health_probe_failed", error=repr(exc))
                await _set_all(health_servicer, names, health_pb2.HealthCheckResponse.NOT_SERVING)
            healthy = False
            continue
        if not healthy:
            log.info("health_probe_recovered")
            await _set_all(health_servicer, names, health_pb2.HealthCheckResponse.SERVING)
        healthy = True


def write_ready_file(path: Path | None, port: int, metrics_port: int | None) -> None:
    """The service side of readiness: publishes the bound gRPC and metrics ports atomically
    (no reader ever sees an empty file), as JSON `{"port": ..., "metrics_port": ...}`."""
    if path is not None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"port": port, "metrics_port": metrics_port}))
        os.replace(tmp, path)
