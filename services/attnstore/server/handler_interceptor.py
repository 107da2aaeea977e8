"""The one shape of this package's server interceptors: each sees a method's handler once
grpc has resolved it, and answers the handler to run instead (or the same one)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc


class HandlerInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: grpc answers UNIMPLEMENTED
            return handler
        return self.handler_for(handler, handler_call_details)

    def handler_for(
        self, handler: grpc.RpcMethodHandler, call: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        raise NotImplementedError
