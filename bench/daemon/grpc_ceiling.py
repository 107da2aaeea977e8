"""The grpcio ceiling for the daemon benchmark's gRPC rows: a bare `grpc.aio` server, in its
own process like the daemon, that streams pre-built bytes in messages of the daemon's
size, read by a `grpc.aio` client that copies them into a preallocated buffer (as
`get_chunks_into` does). No protobuf, no store, no checksums: whatever the daemon's gRPC
Get loses to it is attnstore's; whatever this loses to Redis is grpcio's.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import AsyncIterator

import grpc
import numpy as np
import uvloop

METHOD = "/bench.GrpcCeiling/Get"
MESSAGE_BYTES = 4 * 1024 * 1024  # the daemon's max_get_message_bytes default
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
_OPTIONS = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]


def _serve(ports: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    payload = os.urandom(MAX_PAYLOAD_BYTES)
    messages = {}  # size -> the messages of one reply, built once

    async def get(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        size = int.from_bytes(request, "little")
        if size not in messages:
            messages[size] = [
                payload[i : min(i + MESSAGE_BYTES, size)] for i in range(0, size, MESSAGE_BYTES)
            ]
        for message in messages[size]:
            yield message

    async def run() -> None:
        handler = grpc.method_handlers_generic_handler(
            "bench.GrpcCeiling", {"Get": grpc.unary_stream_rpc_method_handler(get)}
        )
        server = grpc.aio.server(options=_OPTIONS)
        server.add_generic_rpc_handlers((handler,))
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    uvloop.run(run())


class CeilingServer:
    """The bare server as a child process; `address` once started."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._ports = context.Queue()
        self._process = context.Process(target=_serve, args=(self._ports,), daemon=True)
        self.address = ""

    def start(self) -> None:
        self._process.start()
        self.address = f"127.0.0.1:{self._ports.get(timeout=30)}"

    def stop(self) -> None:
        self._process.terminate()
        self._process.join(timeout=10)


class CeilingClient:
    """One channel; `get_into(size, out)` reads `size` bytes into `out`."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address, options=_OPTIONS)
        self._get = self._channel.unary_stream(METHOD)

    async def get_into(self, size: int, out: np.ndarray) -> None:
        view, position = memoryview(out), 0
        async for message in self._get(size.to_bytes(8, "little")):
            view[position : position + len(message)] = message
            position += len(message)
        if position != size:
            raise RuntimeError(f"the ceiling server sent {position} bytes, not {size}")

    async def close(self) -> None:
        await self._channel.close()
