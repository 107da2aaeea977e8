"""Fixtures of the security tests (helpers in secure_stack.py): token files, and daemons
with TLS settings stopped at teardown. The certificates come from tests/conftest.py (`pki`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from secure_stack import Tokens, start_daemon, stop_daemon, write_tokens

from kvstore_daemon.launcher import DaemonProcess

DaemonFactory = Callable[[dict[str, object]], DaemonProcess]


@pytest.fixture(scope="session")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    return write_tokens(tmp_path_factory.mktemp("tokens"))


@pytest.fixture(scope="module")
def daemon_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonFactory]:
    """`daemon_factory(settings)`: a daemon with these settings, stopped at the module's end."""
    started: list[DaemonProcess] = []

    def start(settings: dict[str, object]) -> DaemonProcess:
        started.append(start_daemon(tmp_path_factory.mktemp("daemon"), settings))
        return started[-1]

    try:
        yield start
    finally:
        for daemon in started:
            stop_daemon(daemon)
