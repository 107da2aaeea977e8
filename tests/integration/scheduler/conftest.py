"""Fixtures of the scheduler's integration tests (the stack itself is scheduler_stack.py):
private redis-server processes (installed by tests/conftest.py's `redis_installed`) and
the tiny model the workers run."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scheduler_stack import TINY_LLAMA, RedisFactory, Stack, StartStack, start_stack


@pytest.fixture
def redis_factory(tmp_path: Path, redis_installed: None) -> Iterator[RedisFactory]:
    """Redis servers for one test; all are stopped at teardown."""
    with RedisFactory(tmp_path) as factory:
        yield factory


@pytest.fixture(scope="module")
def module_redis_factory(
    tmp_path_factory: pytest.TempPathFactory, redis_installed: None
) -> Iterator[RedisFactory]:
    """Redis servers shared by the tests of one module."""
    with RedisFactory(tmp_path_factory.mktemp("redis")) as factory:
        yield factory


@pytest.fixture(scope="session")
def scheduler_model_dir(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path]
) -> Path:
    """A tiny random-weight Llama with a long context (long answers for the failure tests)."""
    return tiny_model_saver(tmp_path_factory.mktemp("scheduler-model") / "model", **TINY_LLAMA)


@pytest.fixture(scope="module")
def module_stacks(
    tmp_path_factory: pytest.TempPathFactory, module_redis_factory: RedisFactory
) -> Iterator[StartStack]:
    """`module_stacks(model_dir, **options)`: a stack (start_stack's options) with a Redis of
    its own (`persistent_redis`: one that keeps its data across a restart), stopped at the
    end of the module."""
    with contextlib.ExitStack() as stacks:

        def start(model_dir: Path, *, persistent_redis: bool = False, **options: Any) -> Stack:
            root = tmp_path_factory.mktemp("stack")
            redis = module_redis_factory(persistent=persistent_redis)
            return stacks.enter_context(start_stack(root, model_dir, redis=redis, **options))

        yield start
