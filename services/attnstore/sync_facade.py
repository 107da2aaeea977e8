"""A blocking twin of an asyncio client, made from the client's own methods.

The twin runs the asyncio client on a private BackgroundLoop and waits for each call, so
the two cannot drift apart: a twin's class body only names which methods it offers
(`lookup = blocking(AsyncKVStoreClient.lookup)`) and holds no protocol logic.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

from attnstore.background_loop import BackgroundLoop
from attnstore.closable import Closable

T = TypeVar("T")
P = ParamSpec("P")


class Closes(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=Closes)


class SyncFacade(Closable, Generic[C]):
    """Safe to share between threads (calls interleave on the private loop). `close()` it,
    or use `with`."""

    def __init__(self, thread_name: str, create: Callable[[], C]) -> None:
        """`create` builds the asyncio client; it runs on the loop, since grpc.aio binds a
        channel to the running loop."""
        self._loop = BackgroundLoop(thread_name)

        async def created() -> C:
            return create()

        try:
            self._client = self._loop.run(created())
        except BaseException:
            self._loop.stop()
            raise

    @property
    def aio(self) -> C:
        """The asyncio client underneath, for coroutines given to `submit` or `call`."""
        return self._client

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Starts `coroutine` (built from `aio`) on the client's loop without waiting: loads
        and saves that overlap the caller's own work."""
        return self._loop.submit(coroutine)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_seconds: float | None = None) -> T:
        """Waits for `coroutine` (built from `aio`); past `timeout_seconds` cancels it and
        raises TimeoutError."""
        return self._loop.run(coroutine, timeout_seconds)

    def iterate(self, iterator: AsyncIterator[T]) -> Iterator[T]:
        """`iterator`'s items, each waited for; leaving early closes it on the loop (a
        streamed call is cancelled). An async generator may be made on any thread (its body
        runs on the loop); a grpc.aio call may not: wrap it in one."""
        try:
            while True:
                try:
                    yield self.call(_next_of(iterator))
                except StopAsyncIteration:
                    return
        finally:
            close = getattr(iterator, "aclose", None)
            if close is not None and not self._loop.closed:
                self.call(close())

    def close(self, timeout_seconds: float | None = None) -> None:
        """Ends the client and the loop's thread, each waited for at most `timeout_seconds`."""
        if self._loop.closed:
            return
        try:
            self._loop.run(self._client.close(), timeout_seconds)
        finally:
            self._loop.stop(timeout_seconds)


async def _next_of(iterator: AsyncIterator[T]) -> T:
    return await anext(iterator)  # anext() alone is an awaitable, not the coroutine the loop takes


def blocking(
    method: Callable[Concatenate[C, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncFacade[C], P], T]:
    """The asyncio client's `method`, waited for."""

    @functools.wraps(method)
    def call(self: SyncFacade[C], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.call(method(self.aio, *args, **kwargs))

    return call


def blocking_stream(
    method: Callable[Concatenate[C, P], AsyncIterator[T]],
) -> Callable[Concatenate[SyncFacade[C], P], Iterator[T]]:
    """The asyncio client's streaming `method`, each item waited for."""

    @functools.wraps(method)
    def call(self: SyncFacade[C], /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self.iterate(method(self.aio, *args, **kwargs))

    return call
