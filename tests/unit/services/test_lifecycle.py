"""The shared serving lifecycle in process: health turns SERVING only after the service's
health probe passed, follows the probe while serving, and SIGTERM stops the server."""

from __future__ import annotations

import asyncio
import os
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnstore.server.concurrency import ServingLimits
from attnstore.server.lifecycle import create_server, serve
from attnstore.server.service_settings import ServiceSettings

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Probe:
    def __init__(self) -> None:
        self.healthy = True
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if not self.healthy:
            raise RuntimeError("the device is gone")


async def wait_for_status(
    stub: health_pb2_grpc.HealthStub, status: int, timeout_seconds: float = 5.0
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_seconds
    while (
        await stub.Check(health_pb2.HealthCheckRequest(service="test.Service"), timeout=2)
    ).status != status:
        assert asyncio.get_running_loop().time() < deadline, f"health never became {status}"
        await asyncio.sleep(0.01)


async def test_health_follows_the_probe_and_sigterm_stops() -> None:
    probe, started, stopped = Probe(), asyncio.get_running_loop().create_future(), []

    async def on_stop() -> None:
        stopped.append(True)

    serving = asyncio.create_task(
        serve(
            create_server(ServingLimits()),
            ServiceSettings(listen_address="127.0.0.1:0", shutdown_grace_seconds=1),
            service_names=["test.Service"],
            on_stop=on_stop,
            on_started=started.set_result,
            health_probe=probe,
            health_probe_interval_seconds=0.02,
        )
    )
    port = await asyncio.wait_for(started, 10)
    assert probe.calls >= 1  # it passed before anything reported SERVING
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        await wait_for_status(stub, SERVING)
        probe.healthy = False
        await wait_for_status(stub, NOT_SERVING)
        probe.healthy = True
        await wait_for_status(stub, SERVING)
    os.kill(os.getpid(), signal.SIGTERM)  # serve() handles it on this event loop
    await asyncio.wait_for(serving, 10)
    assert stopped == [True]


async def test_a_failing_probe_at_start_ends_serve_before_it_reports_ready() -> None:
    probe, ready = Probe(), []
    probe.healthy = False
    with pytest.raises(RuntimeError, match="the device is gone"):
        await serve(
            create_server(ServingLimits()),
            ServiceSettings(listen_address="127.0.0.1:0", shutdown_grace_seconds=0),
            service_names=["test.Service"],
            on_started=ready.append,
            health_probe=probe,
        )
    assert ready == []
