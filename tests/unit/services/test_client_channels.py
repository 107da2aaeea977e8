"""A client channel waits for a slow peer's HTTP/2 handshake: a first call to a server that
sends its SETTINGS late (a busy daemon) succeeds instead of failing UNAVAILABLE."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from attnstore.security.credentials import aio_channel

SERVER_DELAY_SECONDS = 0.5  # five times the 100 ms connect timeout the channels once had


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_seconds: float) -> None:
    await asyncio.sleep(delay_seconds)
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def _slow_relay(server_port: int) -> asyncio.Server:
    """Forwards to the server at once, and the server's bytes only after the delay."""

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", server_port)
        await asyncio.gather(
            _pipe(client_reader, server_writer, 0.0),
            _pipe(server_reader, client_writer, SERVER_DELAY_SECONDS),
        )

    return await asyncio.start_server(relay, "127.0.0.1", 0)


async def test_a_first_call_waits_for_a_server_slow_to_send_its_settings() -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    relay = await _slow_relay(port)
    relay_port = relay.sockets[0].getsockname()[1]
    try:
        async with aio_channel(f"127.0.0.1:{relay_port}", None) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        relay.close()
        await server.stop(None)
