"""Copies of KV and hidden states read from the daemon onto a GPU, on a CUDA stream of
their own.

On the default stream such a copy (from pageable memory: synchronous) queues behind every
kernel the engine's forward or a restore's compute thread has queued there, so the reads
of a layer-wise load or of a restore wait for the compute they should overlap. On an H200
(bench-restore, MHA Llama 16 x 2,048, fp32, a 1,024-token history in DRAM) a restore that
recomputed 13 layers while loading 3 took 53.8 ms, the recomputation of all 16 alone 42.7:
the 3 layers' copies ran after the 13 layers' kernels, not beside them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensors = tuple[torch.Tensor, ...]


class CopyStream:
    """Runs copies (and the small kernels that finish them: re-positioning, slicing) for
    `device` off its default stream; on a CPU, in place."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def run(self, work: Callable[[], Tensors]) -> Tensors:
        """`work`'s tensors, finished. Each is marked as used by the default stream, where
        the forward reads it: else the allocator could hand its memory to this stream's
        next copy while the forward's kernels still wait to read it."""
        if self._stream is None:
            return work()
        with torch.cuda.stream(self._stream):
            tensors = work()
        self._stream.synchronize()
        reader = torch.cuda.default_stream(self._device)
        for tensor in tensors:
            tensor.record_stream(reader)
        return tensors
