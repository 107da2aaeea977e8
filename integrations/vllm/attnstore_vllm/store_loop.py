"""The daemon client of one connector, on a private event loop in a daemon thread.

vLLM calls the connector from its own threads without an event loop; loads run as tasks
on this loop while the forward pass computes, and saves as tasks after it, so neither
blocks a step on the daemon."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from attnstore.kvstore_client import AsyncKVStoreClient

T = TypeVar("T")


class StoreLoop:
    def __init__(self, address: str, *, use_shm: bool, shm_dir: Path | None, timeout_seconds: float) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="attnstore-vllm", daemon=True)
        self._thread.start()

        async def create() -> AsyncKVStoreClient:  # grpc.aio binds a channel to the running loop
            # Loads verify each layer themselves, right after copying it (worker_load.py).
            return AsyncKVStoreClient(
                address,
                use_shm=use_shm,
                shm_dir=shm_dir,
                timeout_seconds=timeout_seconds,
                verify_checksums=False,
            )

        self.client = self.run(create(), timeout_seconds)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_seconds: float) -> T:
        """Waits at most `timeout_seconds` (then cancels it and raises TimeoutError)."""
        future = self.submit(coroutine)
        try:
            return future.result(timeout_seconds)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"daemon call exceeded {timeout_seconds:g} s") from None

    def close(self, timeout_seconds: float) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):  # closing a dead channel must not fail vLLM's shutdown
            self.run(self.client.close(), timeout_seconds)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_seconds)
