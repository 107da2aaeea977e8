"""Fixtures of the worker's integration tests: a tiny model loaded the way the worker
loads it (from a directory, with its tokenizer and digest) and real daemon processes.

`tiny_model` is a seeded random-weight fp32 Llama (3 layers, 4 heads, 2 KV heads, head_dim
16) with the suite's tiny tokenizer; `one_layer_model` is the same with one layer (its K and V
depend only on each token and its position). `daemon` is a real daemon process (port 0, its own SSD and
shm directories), ready once its ready file appears, stopped at teardown. `pool` is the
pool's ledger: a private Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from running_daemon import running_daemon
from tiny_llama import TINY_LLAMA_SHAPE

from attnstore.server.redis_process import RedisProcess
from inference_worker.model_store import LoadedModel, load_model
from kvstore_daemon.launcher import DaemonProcess

MiB = 1024 * 1024
TINY_LLAMA = {**TINY_LLAMA_SHAPE, "max_position_embeddings": 1024}


@pytest.fixture(scope="session")
def tiny_model(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path]
) -> LoadedModel:
    directory = tiny_model_saver(tmp_path_factory.mktemp("tiny-llama"), **TINY_LLAMA)
    return load_model(directory, torch.float32, "cpu")


@pytest.fixture(scope="session")
def one_layer_model(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path]
) -> LoadedModel:
    directory = tiny_model_saver(
        tmp_path_factory.mktemp("one-layer"), **{**TINY_LLAMA, "num_hidden_layers": 1}
    )
    return load_model(directory, torch.float32, "cpu")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon with room for the real model's chunks (tests/running_daemon.py)."""
    with running_daemon(tmp_path, dram_bytes=256 * MiB, ssd_bytes=512 * MiB) as process:
        yield process


@pytest.fixture
def pool(tmp_path: Path, redis_installed: None) -> Iterator[tuple[str, Path]]:
    """The pool's ledger (a private Redis): its URL, and the test's folder."""
    redis_server = RedisProcess(tmp_path / "redis")
    redis_server.start()
    try:
        yield redis_server.url, tmp_path
    finally:
        redis_server.stop()
