"""Waiting for background work in blocking tests: a condition polled until a deadline,
never a fixed sleep (tests/async_polling.py is the async twin)."""

from __future__ import annotations

import time
from collections.abc import Callable


def poll(
    condition: Callable[[], bool], what: str, timeout_seconds: float = 60.0, interval_seconds: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds}s waiting for {what}")
        time.sleep(interval_seconds)
