"""What the tests' process factories (daemons, Redis servers) share: each started process
is remembered and stopped at `close()`, or at the end of a `with` block, so a fixture is
`with Factory(root) as factory: yield factory`."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from attnstore.closable import Closable


class Process(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


P = TypeVar("P", bound=Process)


class ProcessFactory(Closable, Generic[P]):
    def __init__(self) -> None:
        self._started: list[P] = []

    def _start(self, process: P) -> P:
        self._started.append(process)
        process.start()
        return process

    def _stop(self, process: P) -> None:
        process.stop()

    def close(self) -> None:
        for process in self._started:
            self._stop(process)
