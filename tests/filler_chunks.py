"""Random chunks of one namespace, written to a daemon to push older chunks out of its
tiers (onto its pool peers): for the pool's worker and scheduler tests."""

from __future__ import annotations

import random

from attnstore.chunks.format import DTYPE_BYTES, encode_chunk
from attnstore.chunks.keys import chunk_key_chain
from attnstore.kvstore_client import AsyncKVStoreClient


async def write_filler(
    client: AsyncKVStoreClient,
    namespace: bytes,
    count: int,
    *,
    num_layers: int,
    kv_heads: int,
    head_dim: int,
    chunk_tokens: int,
    dtype: str,
    seed: int = 0,
) -> list[bytes]:
    """Registers `namespace` and stores `count` chunks of seeded random KV, one durable put
    each (oldest first); their keys, a chain."""
    await client.register_namespace(
        namespace,
        num_layers=num_layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        chunk_tokens=chunk_tokens,
        dtype=dtype,
    )
    rng = random.Random(seed)
    half = kv_heads * chunk_tokens * head_dim * DTYPE_BYTES[dtype]  # K or V of one layer
    keys = chunk_key_chain(namespace, list(range(count * chunk_tokens)), chunk_tokens)
    for index, key in enumerate(keys):
        data = encode_chunk(
            namespace=namespace, key=key, dtype=dtype, kv_heads=kv_heads, tokens=chunk_tokens, head_dim=head_dim,
            base_position=index * chunk_tokens,
            layers=[(rng.randbytes(half), rng.randbytes(half)) for _ in range(num_layers)],
        )  # fmt: skip
        await client.put_chunks(namespace, [(key, data)], durable=True)
    return keys
