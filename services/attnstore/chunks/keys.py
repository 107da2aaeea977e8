"""Namespaces and chained chunk keys.

`key_i = blake3(domain, namespace, key_{i-1}, len_i, tokens_i)` over little-endian
uint32 token ids: identical prefixes give identical keys in every process on every
node, and nothing depends on Python's `hash()` or a seed. The token count is hashed,
so a partial tail chunk never shares a key with a full chunk.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import blake3
import msgpack

NAMESPACE_BYTES = 16
KEY_BYTES = 32
LAYOUT_VERSION = 1
_NAMESPACE_DOMAIN = b"attnstore/namespace/v1\0"
_CHUNK_DOMAIN = b"attnstore/chunk/v1\0"
_ROOT_PARENT = bytes(KEY_BYTES)
_MAX_TOKEN_ID = 2**32 - 1


@dataclass(frozen=True)
class NamespaceSpec:
    """Everything that makes KV incompatible; two specs share KV only if equal."""

    model_digest: str  # digest of the model's config and weights
    dtype: str  # "float32", "float16" or "bfloat16"
    chunk_tokens: int
    tenant_salt: bytes = b""  # per-tenant isolation: KV is never shared across tenants
    layout_version: int = LAYOUT_VERSION

    def namespace_id(self) -> bytes:
        payload = msgpack.packb(
            [self.model_digest, self.dtype, self.chunk_tokens, self.tenant_salt, self.layout_version]
        )
        return blake3.blake3(_NAMESPACE_DOMAIN + payload).digest(NAMESPACE_BYTES)


def chunk_key(namespace: bytes, parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """The key of one chunk of `tokens` following the chunk keyed `parent` (None: the first)."""
    if len(namespace) != NAMESPACE_BYTES:
        raise ValueError(f"namespace must be {NAMESPACE_BYTES} bytes, got {len(namespace)}")
    if parent is not None and len(parent) != KEY_BYTES:
        raise ValueError(f"parent key must be {KEY_BYTES} bytes, got {len(parent)}")
    if any(t < 0 or t > _MAX_TOKEN_ID for t in tokens):
        raise ValueError("token ids must fit in an unsigned 32-bit integer")
    hasher = blake3.blake3(_CHUNK_DOMAIN)
    hasher.update(namespace)
    hasher.update(parent or _ROOT_PARENT)
    hasher.update(struct.pack(f"<I{len(tokens)}I", len(tokens), *tokens))
    return hasher.digest(KEY_BYTES)


def chunk_key_chain(
    namespace: bytes,
    tokens: Sequence[int],
    chunk_tokens: int,
    *,
    include_partial: bool = False,
    parent: bytes | None = None,
) -> list[bytes]:
    """Keys of the consecutive chunks of `tokens`; the partial tail is keyed only on request.
    `parent` chains the first chunk to another key (a prompt module's) instead of the root."""
    if chunk_tokens <= 0:
        raise ValueError("chunk_tokens must be positive")
    end = len(tokens) if include_partial else len(tokens) - len(tokens) % chunk_tokens
    keys: list[bytes] = []
    for start in range(0, end, chunk_tokens):
        parent = chunk_key(namespace, parent, tokens[start : min(start + chunk_tokens, end)])
        keys.append(parent)
    return keys
