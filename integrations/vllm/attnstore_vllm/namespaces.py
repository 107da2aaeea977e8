"""The chunk namespace of a vLLM engine and tenant, and its registration with the daemon.

The namespace digests what makes KV incompatible (attnstore.chunks.keys.NamespaceSpec):
the model, the dtype, `chunk_tokens`, the tenant and, with tensor parallelism, the rank
(each rank holds its own kv heads). vLLM's block layout is not part of it: chunks are
stored layout-free (`[kv_heads, tokens, head_dim]` per layer), so a chunk saved by vLLM on
the CPU backend loads into FlashAttention's blocks, and into the attnstore worker when
`model_digest` is the worker's digest of the same files (tensor-parallel size 1).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import blake3

from attnstore.chunks.keys import NamespaceSpec

RETRY_SECONDS = 5.0  # a daemon that does not answer costs one registration timeout per 5 s
DTYPE_NAMES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16"}


@dataclass(frozen=True)
class ModelShape:
    """What the daemon needs to check chunks of one rank of the model."""

    label: str  # for the daemon's stats
    digest: str
    dtype: str  # "float32", "float16" or "bfloat16"
    num_layers: int
    kv_heads: int  # of one tensor-parallel rank
    head_dim: int
    tp_size: int


def config_digest(model: str, hf_config_json: str) -> str:
    """A digest of the model's name and configuration, for when no weights digest is given."""
    canonical = json.dumps(json.loads(hf_config_json), sort_keys=True, separators=(",", ":"))
    return blake3.blake3(f"attnstore-vllm/model/v1\0{model}\0{canonical}".encode()).hexdigest()


def namespace_id(shape: ModelShape, chunk_tokens: int, tenant: str, tp_rank: int) -> bytes:
    digest = shape.digest if shape.tp_size == 1 else f"{shape.digest}/tp{tp_rank}of{shape.tp_size}"
    return NamespaceSpec(digest, shape.dtype, chunk_tokens, tenant.encode()).namespace_id()


class NamespaceRegistry:
    """Registers each namespace once; after a failure, again at most every RETRY_SECONDS."""

    def __init__(self, register: Callable[[bytes], None]) -> None:
        self._register = register
        self._registered: set[bytes] = set()
        self._retry_at: dict[bytes, float] = {}

    def ensure(self, namespace: bytes) -> bool:
        """Whether the daemon knows `namespace`; never raises."""
        if namespace in self._registered:
            return True
        if time.monotonic() < self._retry_at.get(namespace, 0.0):
            return False
        try:
            self._register(namespace)
        except Exception:  # noqa: BLE001 -- retried by the next caller after RETRY_SECONDS
            self._retry_at[namespace] = time.monotonic() + RETRY_SECONDS
            return False
        self._registered.add(namespace)
        return True
