"""A clock the unit tests move by hand (tests/ is on sys.path through the root conftest):
components that take a `clock: Callable[[], float]` read `now`."""

from __future__ import annotations


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
