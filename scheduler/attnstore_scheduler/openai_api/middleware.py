"""ASGI middleware of the HTTP API: the request body limit and the request counter."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from attnstore_scheduler.openai_api import http_metrics
from attnstore_scheduler.openai_api.errors import ApiError


class BodyTooLarge(HTTPException):
    """Raised while the body is read (FastAPI passes HTTPExceptions on unchanged)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body is larger than {max_bytes} bytes, the most allowed")


class BodyLimit:
    """Refuses bodies over `max_bytes` (413): by Content-Length before reading, and by the
    bytes received for a chunked body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            too_large = BodyTooLarge(self.max_bytes)
            error = ApiError(413, str(too_large.detail), "invalid_request_error", "request_too_large")
            await error.response()(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited, send)


class RequestCounter:
    """Counts requests by route and response status (attnstore_openai_requests_total)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                path = getattr(route, "path", "unknown")
                http_metrics.REQUESTS.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting)
