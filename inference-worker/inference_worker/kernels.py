"""Which kernels the worker's model runs on, and why.

Decided once when the model loads (probes, settings, the device), logged once at start,
answered in DescribeModel and shown by `attnstore status`: a worker on a CPU without
AVX-512 or without oneDNN's bf16 kernels runs correctly on torch's defaults, and an
operator should see that without reading code.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from attnstore.c_build import load_probed

Kernel = TypeVar("Kernel")


@dataclass(frozen=True)
class KernelChoice:
    kernel: str  # e.g. "onednn", "torch", "sdpa-grouped-query"
    reason: str  # a probe's verdict, a setting, or the device


@dataclass(frozen=True)
class KernelReport:
    device: str
    cpu_capability: str  # what torch dispatches on: "AVX512", "AVX2", "DEFAULT"...
    linear: KernelChoice
    attention: KernelChoice


def cpu_capability() -> str:
    """The CPU's instruction set as torch's CPU kernels dispatch on it (detected at run time)."""
    return str(torch.backends.cpu.get_cpu_capability())


def load_choice(
    source: Path,
    unavailable_variable: str,
    wrap: Callable[[ctypes.CDLL], Kernel],
    probe: Callable[[Kernel], str | None],
    chosen: KernelChoice,
    otherwise: str,
    fallback: str = "torch",
) -> tuple[Kernel | None, KernelChoice]:
    """`load_probed` with its choice for the kernel report: `chosen`, or `fallback` saying why
    the kernel is unavailable and that `otherwise` runs instead."""
    kernel, error = load_probed(source, unavailable_variable, wrap, probe)
    if kernel is None:
        return None, KernelChoice(fallback, f"{source.stem} kernel unavailable ({error}): {otherwise}")
    return kernel, chosen
