"""Waiting for background work in async tests: a condition polled until a deadline, never a
fixed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def wait_until(
    condition: Callable[[], Awaitable[bool]],
    what: str,
    timeout_seconds: float = 10.0,
    interval_seconds: float = 0.02,
) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds}s waiting for {what}")
        await asyncio.sleep(interval_seconds)
