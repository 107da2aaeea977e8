"""How many KV blocks the pool gets: `kv_memory_bytes` when set, else a share of the memory
the device has free once the model is loaded (vLLM and nano-vllm size theirs the same way).
On a CPU that is the available RAM: the pool's pages are touched only when used."""

from __future__ import annotations

import psutil
import torch

from inference_worker.model_geometry import ModelGeometry


class PoolTooSmall(ValueError):
    """The memory budget holds no whole block; the message says why."""


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return int(psutil.virtual_memory().available)


def pool_blocks(
    geometry: ModelGeometry,
    block_tokens: int,
    element_bytes: int,
    device: torch.device,
    *,
    kv_memory_bytes: int | None,
    kv_memory_fraction: float,
) -> int:
    block_bytes = block_tokens * geometry.kv_bytes_per_token(element_bytes)
    budget = (
        kv_memory_bytes
        if kv_memory_bytes is not None
        else int(free_memory_bytes(device) * kv_memory_fraction)
    )
    if budget < block_bytes:
        raise PoolTooSmall(
            f"the KV pool's {budget} bytes hold no block of {block_tokens} tokens ({block_bytes} bytes); "
            "raise kv_memory_bytes or kv_memory_fraction"
        )
    return budget // block_bytes
