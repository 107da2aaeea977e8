"""An event loop in a daemon thread, for callers that have none (blocking code, vLLM's
threads): coroutines are submitted to it from any thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from threading import Thread
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    def __init__(self, thread_name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = Thread(target=self._loop.run_forever, name=thread_name, daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._loop.is_closed()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_seconds: float | None = None) -> T:
        """Waits for `coroutine`; past `timeout_seconds` cancels it and raises TimeoutError."""
        future = self.submit(coroutine)
        try:
            return future.result(timeout_seconds)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"call exceeded {timeout_seconds:g} s") from None

    def stop(self, timeout_seconds: float | None = None) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_seconds)
        if not self._thread.is_alive():  # a loop still running a callback cannot be closed
            self._loop.close()
