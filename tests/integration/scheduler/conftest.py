"""Fixtures of the scheduler's integration tests (the stack itself is scheduler_stack.py):
private redis-server processes (installed by tests/conftest.py's `redis_installed`) and
the tiny model the workers run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from scheduler_stack import TINY_LLAMA, RedisFactory


@pytest.fixture
def redis_factory(tmp_path: Path, redis_installed: None) -> Iterator[RedisFactory]:
    """Redis servers for one test; all are stopped at teardown."""
    factory = RedisFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="module")
def module_redis_factory(
    tmp_path_factory: pytest.TempPathFactory, redis_installed: None
) -> Iterator[RedisFactory]:
    """Redis servers shared by the tests of one module."""
    factory = RedisFactory(tmp_path_factory.mktemp("redis"))
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="session")
def scheduler_model_dir(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path]
) -> Path:
    """A tiny random-weight Llama with a long context (long answers for the failure tests)."""
    return tiny_model_saver(tmp_path_factory.mktemp("scheduler-model") / "model", **TINY_LLAMA)
