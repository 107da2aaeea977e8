"""The engine's C kernels as this machine builds them and as a CPU without AVX-512 runs them
(their portable loops): tests parametrized over C_BUILDS check both on every machine."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from attnstore.c_build import build_library
from inference_worker.kernels import KernelChoice

C_BUILDS = ["native", "without-avx512"]
Kernel = TypeVar("Kernel")


def built_kernel(
    build: str,
    source: Path,
    wrap: Callable[[ctypes.CDLL], Kernel],
    load: Callable[[], tuple[Kernel | None, KernelChoice]],
) -> Kernel:
    """`source`'s kernel in one of C_BUILDS: the engine's own load, or one built with -mno-avx512f."""
    if build == "without-avx512":
        return wrap(ctypes.CDLL(str(build_library(source, ("-mno-avx512f",)))))
    loaded, choice = load()
    assert loaded is not None, choice.reason  # the development machines have a C compiler
    return loaded


def assert_forced_unavailable(
    monkeypatch: pytest.MonkeyPatch, load: Any, variable: str, fallback: str
) -> None:
    """`load` (a kernel's cached loader, called afresh) with `variable`=1 gives no kernel and
    `fallback`, saying why."""
    monkeypatch.setenv(variable, "1")
    loaded, choice = load.__wrapped__()
    assert loaded is None and variable in choice.reason and choice.kernel == fallback
