"""Which kernels the worker's model runs on, and why.

Decided once when the model loads (probes, settings, the device), logged once at start,
answered in DescribeModel and shown by `attnstore status`: a worker on a CPU without
AVX-512 or without oneDNN's bf16 kernels runs correctly on torch's defaults, and an
operator should see that without reading code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
