"""Module identity in the store. A schema is identified by the blake3 digest of its canonical
printed form; a module's key by (tenant namespace, schema digest, module path), not by a token
prefix, so the same module in any prompt finds the same KV. Keys have the size of chunk keys,
and a module's KV is split into chunks chained from its key exactly as prompt chunks are
chained from the root, so module KV lives in the daemon's tiers like any chunk."""

from __future__ import annotations

from collections.abc import Sequence

import blake3
import msgpack

from attnstore.chunks.keys import KEY_BYTES, NAMESPACE_BYTES, chunk_key_chain
from attnstore.prompt_modules.names import ModulePath
from attnstore.prompt_modules.nodes import Schema
from attnstore.prompt_modules.printer import print_schema

SCHEMA_DIGEST_BYTES = 32
_SCHEMA_DOMAIN = b"attnstore/pml-schema/v1\0"
# v2: modules are encoded after their ancestors' preceding text (v1: alone), so v1 KV in a
# daemon is never read as v2's.
_MODULE_DOMAIN = b"attnstore/pml-module/v2\0"


def schema_digest(schema: Schema) -> bytes:
    return blake3.blake3(_SCHEMA_DOMAIN + print_schema(schema).encode("utf-8")).digest(SCHEMA_DIGEST_BYTES)


def module_key(
    namespace: bytes, schema_digest: bytes, module_path: ModulePath, *, scaffold: str | None = None
) -> bytes:
    """The key of a module's KV: encoded alone, or within `scaffold` (its KV then differs)."""
    if len(namespace) != NAMESPACE_BYTES:
        raise ValueError(f"namespace must be {NAMESPACE_BYTES} bytes, got {len(namespace)}")
    if len(schema_digest) != SCHEMA_DIGEST_BYTES:
        raise ValueError(f"schema digest must be {SCHEMA_DIGEST_BYTES} bytes, got {len(schema_digest)}")
    # msgpack frames each part, so ("ab", "c") and ("a", "bc") never hash alike.
    payload = msgpack.packb([list(module_path), scaffold])
    return blake3.blake3(_MODULE_DOMAIN + namespace + schema_digest + payload).digest(KEY_BYTES)


def module_chunk_keys(
    namespace: bytes, module_key: bytes, token_ids: Sequence[int], chunk_tokens: int
) -> list[bytes]:
    """Keys of the chunks of a module's KV (its own `token_ids`), the partial tail included."""
    return chunk_key_chain(namespace, token_ids, chunk_tokens, include_partial=True, parent=module_key)
