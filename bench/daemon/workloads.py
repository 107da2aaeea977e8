"""The chunks the benchmark moves: SmolLM2-135M's KV layout in bf16 (30 layers, 3 KV
heads, head_dim 64), with chunk_tokens chosen so the serialized chunks are about 0.5,
2, 5.9 and 8 MB (decimal). 256 tokens is the real default chunk (5,902,336 bytes); the
others keep the model's shape and only change the token count, so every size has the
same header, the same 30 layers and only longer layers.

Payloads are seeded random bytes (numpy default_rng(0)), so runs move identical bytes.
Each size gets a pool of distinct chunks of at least POOL_BYTES: more than twice the
last-level cache, so neither memcpy nor the daemon reads a cache-resident source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnstore.chunks.format import encode_chunk, max_chunk_bytes
from attnstore.chunks.keys import NamespaceSpec, chunk_key

MODEL = "SmolLM2-135M-Instruct"
LAYERS, KV_HEADS, HEAD_DIM, DTYPE = 30, 3, 64, "bfloat16"
SIZE_TOKENS = {"0.5MB": 22, "2MB": 87, "5.9MB": 256, "8MB": 347}  # label -> chunk_tokens
HEADLINE = "5.9MB"  # the real 256-token chunk: the summary ratios are measured on it
POOL_BYTES = 64_000_000
POOL_MULTIPLE = 4  # pools split evenly between up to 4 workers
SEED = 0


@dataclass(frozen=True)
class ChunkPool:
    label: str
    chunk_tokens: int
    namespace: bytes
    keys: list[bytes]
    chunks: list[bytes]  # serialized chunks, chunks[i] stored under keys[i]

    @property
    def chunk_bytes(self) -> int:
        return len(self.chunks[0])

    @property
    def count(self) -> int:
        return len(self.keys)

    def layout(self) -> dict[str, int | str]:
        return {
            "num_layers": LAYERS,
            "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "chunk_tokens": self.chunk_tokens,
            "dtype": DTYPE,
        }


def chunk_bytes_for(chunk_tokens: int) -> int:
    return max_chunk_bytes(
        num_layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, chunk_tokens=chunk_tokens, dtype=DTYPE
    )


def pool_count(chunk_bytes: int) -> int:
    count = max(2 * POOL_MULTIPLE, -(-POOL_BYTES // chunk_bytes))
    return -(-count // POOL_MULTIPLE) * POOL_MULTIPLE


def make_pool(label: str, rng: np.random.Generator) -> ChunkPool:
    tokens = SIZE_TOKENS[label]
    namespace = NamespaceSpec(model_digest=MODEL, dtype=DTYPE, chunk_tokens=tokens).namespace_id()
    half = KV_HEADS * tokens * HEAD_DIM * 2  # bytes of K (or V) of one layer in bf16
    keys, chunks = [], []
    parent = None
    for index in range(pool_count(chunk_bytes_for(tokens))):
        parent = chunk_key(namespace, parent, list(range(index * tokens, (index + 1) * tokens)))
        layers = [(rng.bytes(half), rng.bytes(half)) for _ in range(LAYERS)]
        chunks.append(
            encode_chunk(
                namespace=namespace,
                key=parent,
                dtype=DTYPE,
                kv_heads=KV_HEADS,
                tokens=tokens,
                head_dim=HEAD_DIM,
                base_position=index * tokens,
                layers=layers,
            )
        )
        keys.append(parent)
    if len(chunks[0]) != chunk_bytes_for(tokens):
        raise RuntimeError(f"{label}: encoded {len(chunks[0])} bytes, expected {chunk_bytes_for(tokens)}")
    return ChunkPool(label, tokens, namespace, keys, chunks)
