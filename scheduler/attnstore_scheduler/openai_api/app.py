"""The HTTP application and its server: uvicorn in the scheduler's own event loop (uvloop),
on a socket bound before the scheduler reports ready, so a client that read the ready
file finds the HTTP port open too. The scheduler's lifecycle owns SIGTERM: `begin_stop`
runs when the gRPC server begins its stop, so both drain in the same grace period."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl

import uvicorn
from fastapi import FastAPI

from attnstore.security import ServerTLS
from attnstore_scheduler.openai_api.context import ApiContext
from attnstore_scheduler.openai_api.errors import install_error_handlers
from attnstore_scheduler.openai_api.middleware import BodyLimit, RequestCounter
from attnstore_scheduler.openai_api.routes import build_router


def create_app(context: ApiContext, *, max_request_bytes: int) -> FastAPI:
    app = FastAPI(title="attnstore OpenAI-compatible API", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.include_router(build_router(context))
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    app.add_middleware(RequestCounter)  # outermost: counts the 413s too
    return app


class _Server(uvicorn.Server):
    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        """The scheduler's lifecycle handles the signals, not uvicorn."""
        return contextlib.nullcontext()


class HttpServer:
    def __init__(self, app: FastAPI, address: str, *, grace_seconds: float, tls: ServerTLS) -> None:
        """Binds `address` (host:port; port 0 picks one) now."""
        host, _, port = address.rpartition(":")
        self._socket = socket.create_server((host.strip("[]") or "0.0.0.0", int(port)))
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=grace_seconds,
            ssl_certfile=tls.cert_file,
            ssl_keyfile=tls.key_file,
            ssl_ca_certs=tls.client_ca_file,
            ssl_cert_reqs=ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_NONE,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[self._socket]))

    def begin_stop(self) -> None:
        """Stops accepting; in-flight requests get the grace period, then are cancelled."""
        self._server.should_exit = True

    async def stop(self) -> None:
        """`begin_stop`, and waits until the server has stopped."""
        self.begin_stop()
        if self._task is not None:
            await self._task
