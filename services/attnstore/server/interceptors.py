"""One interceptor for every service: bounds the calls running at once (concurrency.py),
maps domain errors to gRPC statuses, logs unexpected exceptions, records per-method
latency, answers requests whose bytes do not parse with INVALID_ARGUMENT, and lets
handlers reply with already serialized messages."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog
from prometheus_client import Histogram

from attnstore import errors
from attnstore.server.concurrency import UNLIMITED_SERVICES, CallLimitReached, ConcurrencyLimit
from attnstore.server.handler_interceptor import HandlerInterceptor

_STATUS_OF: dict[type[errors.ServiceError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.DataLoss: grpc.StatusCode.DATA_LOSS,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
}

RPC_SECONDS = Histogram(
    "attnstore_rpc_duration_seconds",
    "Server-side latency of gRPC methods",
    ["method", "code"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

log = structlog.get_logger("attnstore.rpc")


def status_of(exc: errors.ServiceError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in _STATUS_OF:
            return _STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL


class ErrorAndMetricsInterceptor(HandlerInterceptor):
    """Wraps every handler; a client's mistake never surfaces as INTERNAL."""

    def __init__(self, limit: ConcurrencyLimit) -> None:
        self._limit = limit

    def handler_for(
        self, handler: grpc.RpcMethodHandler, call: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        method = call.method.rsplit("/", 1)[-1]
        limit = None if call.method.startswith(UNLIMITED_SERVICES) else self._limit
        kwargs = {
            "request_deserializer": _tolerant(handler.request_deserializer),
            "response_serializer": _passing_bytes(handler.response_serializer),
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(method, limit, handler.unary_unary), **kwargs
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary(method, limit, handler.stream_unary), **kwargs
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(method, limit, handler.unary_stream), **kwargs
            )
        return grpc.stream_stream_rpc_method_handler(
            _wrap_stream(method, limit, handler.stream_stream), **kwargs
        )


def _passing_bytes(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """Hot paths may reply with an already serialized message; it goes out unchanged."""
    if serialize is None:
        return None

    def serialize_unless_bytes(response: Any) -> bytes:
        return response if isinstance(response, bytes) else serialize(response)

    return serialize_unless_bytes


class _Malformed:
    """A request whose bytes are not a message of the method's type (grpc would answer
    UNKNOWN); the wrapped handler refuses it as the client's mistake."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 -- protobuf's DecodeError, or any parse failure
            return _Malformed(exc)

    return parse


def _checked(request: Any) -> Any:
    """The request, or for a request stream the stream, with malformed messages refused."""
    if isinstance(request, _Malformed):
        raise errors.InvalidArgument(f"the request could not be parsed: {request.error}")
    if hasattr(request, "__aiter__"):
        return _checked_stream(request)
    return request


async def _checked_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield _checked(request)


# A status message travels as a trailer: clients drop one past 8 KiB as RESOURCE_EXHAUSTED and
# lose the reason, and messages quote the request (an id of 300,000 characters once).
MAX_STATUS_MESSAGE_CHARS = 2048


async def _abort(method: str, exc: BaseException, context: grpc.aio.ServicerContext) -> None:
    if isinstance(exc, errors.ServiceError):
        code, message = status_of(exc), str(exc)
        if len(message) > MAX_STATUS_MESSAGE_CHARS:
            message = f"{message[:MAX_STATUS_MESSAGE_CHARS]}... ({len(message)} characters, cut)"
        if isinstance(exc, errors.Overloaded):
            context.set_trailing_metadata((("retry-after-ms", str(exc.retry_after_ms)),))
        if not isinstance(exc, CallLimitReached):  # that one is logged by the limit, once per period
            log.info("rpc_rejected", method=method, code=code.name, reason=message)
    else:
        code, message = grpc.StatusCode.INTERNAL, f"internal error in {method}; see the server log"
        log.exception("rpc_failed", method=method)
    await context.abort(code, message)


@contextlib.asynccontextmanager
async def _observed(
    method: str, limit: ConcurrencyLimit | None, context: grpc.aio.ServicerContext
) -> AsyncIterator[None]:
    """Holds a call slot (`limit` None: unlimited), times the call and answers its exceptions
    with a status."""
    start, code = time.perf_counter(), "OK"
    try:
        with limit.admit(method) if limit is not None else contextlib.nullcontext():
            yield
    except grpc.aio.AbortError:
        raise  # the handler chose its status itself
    except Exception as exc:  # noqa: BLE001 -- the one place every failure becomes a status
        code = status_of(exc).name if isinstance(exc, errors.ServiceError) else "INTERNAL"
        await _abort(method, exc, context)
    finally:
        RPC_SECONDS.labels(method, code).observe(time.perf_counter() - start)


def _wrap_unary(
    method: str, limit: ConcurrencyLimit | None, behavior: Callable[..., Awaitable[Any]]
) -> Callable[..., Awaitable[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with _observed(method, limit, context):
            return await behavior(_checked(request), context)

    return wrapped


def _wrap_stream(
    method: str, limit: ConcurrencyLimit | None, behavior: Callable[..., AsyncIterator[Any]]
) -> Callable[..., AsyncIterator[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with _observed(method, limit, context):
            async for response in behavior(_checked(request), context):
                yield response

    return wrapped
