"""OpenAI-shaped errors: `{"error": {"message", "type", "code", "param"}}` with the HTTP
status of the domain error (the HTTP edge's counterpart of the gRPC interceptor's table).

Retry-After goes with the statuses a retry fixes: 429 for the tenant's rate (its bucket's
wait) and a full queue, 503 when no worker can run the turn. A 429 for a configured
quota (sessions, KV or tokens of a tenant) has none: waiting does not free it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from attnstore import errors
from attnstore_scheduler.job_queue import QueueFull
from attnstore_scheduler.rate_limit import RateLimited

log = structlog.get_logger("attnstore_scheduler.openai_api")

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
_QUEUE_FULL_RETRY_SECONDS = 1
_UNAVAILABLE_RETRY_SECONDS = 1


@dataclass
class ApiError(Exception):
    status: int
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# First match along the error's class hierarchy: (status, type, code).
_HTTP_OF: dict[type[errors.ServiceError], tuple[int, str, str]] = {
    errors.InvalidArgument: (400, "invalid_request_error", "invalid_value"),
    errors.OutOfRange: (400, "invalid_request_error", "invalid_value"),
    errors.FailedPrecondition: (400, "invalid_request_error", "failed_precondition"),
    errors.AlreadyExists: (409, "invalid_request_error", "already_exists"),
    errors.Unauthenticated: (401, "authentication_error", "invalid_api_key"),
    errors.PermissionDenied: (403, "permission_error", "permission_denied"),
    errors.NotFound: (404, "not_found_error", "not_found"),
    RateLimited: (429, "rate_limit_error", "rate_limit_exceeded"),
    QueueFull: (429, "rate_limit_error", "queue_full"),
    errors.ResourceExhausted: (429, "insufficient_quota", "limit_exceeded"),
    errors.Unavailable: (503, "server_error", "unavailable"),
}


def from_service_error(exc: errors.ServiceError) -> ApiError:
    for cls in type(exc).__mro__:
        if cls in _HTTP_OF:
            status, kind, code = _HTTP_OF[cls]
            return ApiError(status, str(exc), kind, code, headers=_retry_after(exc))
    log.error("unmapped_service_error", error=repr(exc))
    return ApiError(500, str(exc), "server_error", "internal_error")


def _retry_after(exc: errors.ServiceError) -> dict[str, str]:
    if isinstance(exc, RateLimited):
        seconds = max(1, math.ceil(exc.retry_after_ms / 1000))
    elif isinstance(exc, QueueFull):
        seconds = _QUEUE_FULL_RETRY_SECONDS
    elif isinstance(exc, errors.Unavailable):
        seconds = _UNAVAILABLE_RETRY_SECONDS
    else:
        return {}
    return {"Retry-After": str(seconds)}


def invalid_body(exc: RequestValidationError) -> ApiError:
    """Every problem of the body, each as `field.path: what is wrong`."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"] if part != "body")
        problems.append(f"{where}: {error['msg']}" if where else str(error["msg"]))
    first = exc.errors()[0]["loc"] if exc.errors() else ()
    param = ".".join(str(part) for part in first if part != "body") or None
    return ApiError(400, "; ".join(problems), "invalid_request_error", "invalid_value", param=param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(errors.ServiceError)
    async def on_service_error(request: Request, exc: errors.ServiceError) -> JSONResponse:
        return from_service_error(exc).response()

    @app.exception_handler(RequestValidationError)
    async def on_invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        return invalid_body(exc).response()

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        code = _HTTP_CODES.get(exc.status_code)
        return ApiError(
            exc.status_code, str(exc.detail), kind, code, headers=dict(exc.headers or {})
        ).response()
