"""Which kernels the worker's model runs on, and why.

Decided once when the model loads (probes, settings, the device), logged once at start,
answered in DescribeModel and shown by `attnstore status`: a worker on a CPU without
AVX-512 or without oneDNN's bf16 kernels runs correctly on torch's defaults, and an
operator should see that without reading code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnstore.worker.v1 import worker_pb2 as pb


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

    def message(self) -> pb.KernelReport:
        return pb.KernelReport(
            device=self.device,
            cpu_capability=self.cpu_capability,
            linear=pb.KernelChoice(kernel=self.linear.kernel, reason=self.linear.reason),
            attention=pb.KernelChoice(kernel=self.attention.kernel, reason=self.attention.reason),
        )


def cpu_capability() -> str:
    """The CPU's instruction set as torch's CPU kernels dispatch on it (detected at run time)."""
    return str(torch.backends.cpu.get_cpu_capability())
