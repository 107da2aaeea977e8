"""The fuzz tests' fixture: one stack of real services for the whole session
(fuzz_stack.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fuzz_stack import FuzzStack, running_fuzz_stack


@pytest.fixture(scope="session")
def fuzz_stack(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path]
) -> Iterator[FuzzStack]:
    root = tmp_path_factory.mktemp("fuzz")
    model_dir = tiny_model_saver(root / "model", max_position_embeddings=1024)
    with running_fuzz_stack(root, model_dir) as stack:
        yield stack
