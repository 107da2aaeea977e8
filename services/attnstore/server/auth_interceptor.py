"""Enforces internal auth (attnstore.security.internal_auth) on a server: a call without
an internal credential is refused with UNAUTHENTICATED, a non-admin call to an admin
method with PERMISSION_DENIED, before any handler runs. The standard health service stays
open: Kubernetes and Docker probes carry no credentials, and it tells only SERVING or not."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health

from attnstore.security.internal_auth import InternalAuth
from attnstore.security.tls import ServerTLS
from attnstore.server.handler_interceptor import HandlerInterceptor

log = structlog.get_logger("attnstore.auth")

_OPEN_PREFIX = f"/{health.SERVICE_NAME}/"
Refusal = tuple[grpc.StatusCode, str]
_NO_CREDENTIAL = (
    "this endpoint needs an internal credential: a client certificate (mutual TLS) or "
    "'authorization: Bearer <internal token>'"
)


def internal_auth_interceptors(
    auth: InternalAuth, tls: ServerTLS, admin_methods: Collection[str] = ()
) -> list[grpc.aio.ServerInterceptor]:
    """What a server's create_server() needs for `auth`: nothing when it is off."""
    if not auth.enabled:
        return []
    interceptor = InternalAuthInterceptor(
        auth, client_cert_required=tls.require_client_cert, admin_methods=admin_methods
    )
    return [interceptor]


class InternalAuthInterceptor(HandlerInterceptor):
    def __init__(
        self, auth: InternalAuth, *, client_cert_required: bool, admin_methods: Collection[str] = ()
    ) -> None:
        """`client_cert_required`: the TLS handshake already verified every caller's
        certificate (mutual TLS), so each caller is internal. `admin_methods`: full method
        names ("/package.Service/Method") that need an admin token."""
        self._internal = [bytes.fromhex(d) for d in (*auth.token_sha256, *auth.admin_token_sha256)]
        self._admin = [bytes.fromhex(d) for d in auth.admin_token_sha256]
        self._client_cert_required = client_cert_required
        self._admin_methods = frozenset(admin_methods)

    def handler_for(
        self, handler: grpc.RpcMethodHandler, call: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        method = call.method
        if method.startswith(_OPEN_PREFIX):
            return handler
        refusal = self.refusal(method, call.invocation_metadata or ())
        if refusal is None:
            return handler
        log.info("rpc_refused", method=method, code=refusal[0].name, reason=refusal[1])
        return _refusing(handler, refusal)

    def refusal(self, method: str, metadata: Sequence[tuple[str, str | bytes]]) -> Refusal | None:
        """Why a call to `method` with this metadata is refused; None: it may proceed."""
        header = _authorization(metadata)
        admin = False
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return grpc.StatusCode.UNAUTHENTICATED, "the authorization header must be 'Bearer <token>'"
            digest = hashlib.sha256(token.strip().encode()).digest()
            if not _any_equal(digest, self._internal):
                return grpc.StatusCode.UNAUTHENTICATED, "the internal token is not valid"
            admin = _any_equal(digest, self._admin)
        elif not self._client_cert_required:
            return grpc.StatusCode.UNAUTHENTICATED, _NO_CREDENTIAL
        if method in self._admin_methods and not admin:
            return grpc.StatusCode.PERMISSION_DENIED, f"{method} is an admin call: it needs an admin token"
        return None


def _any_equal(digest: bytes, accepted: list[bytes]) -> bool:
    # Every accepted digest is compared, each in constant time.
    return sum(hmac.compare_digest(digest, candidate) for candidate in accepted) > 0


def _authorization(metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
    for name, value in metadata:
        if name == "authorization":
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return None


def _refusing(handler: grpc.RpcMethodHandler, refusal: Refusal) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only answers `refusal`."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(*refusal)

    async def refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(*refusal)
        yield  # never reached (abort raises); makes this a response stream

    if handler.response_streaming:
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse_stream)
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
