"""Schema digests and module keys: stable, chunk-key sized, and different wherever KV differs."""

import pytest
from other_interpreter import output_of

from attnstore.chunks.keys import KEY_BYTES, NamespaceSpec, chunk_key
from attnstore.prompt_modules import (
    SCHEMA_DIGEST_BYTES,
    module_chunk_keys,
    module_key,
    parse_schema,
    schema_digest,
)

SCHEMA = parse_schema('<schema name="s"><module name="a">x<module name="b">y</module></module></schema>')
TENANT_A = NamespaceSpec("smollm2@1", "bfloat16", 4, tenant_salt=b"tenant-a").namespace_id()
TENANT_B = NamespaceSpec("smollm2@1", "bfloat16", 4, tenant_salt=b"tenant-b").namespace_id()
DIGEST = schema_digest(SCHEMA)


def test_the_digest_hashes_the_canonical_form() -> None:
    reformatted = parse_schema(
        '<schema name="s">\n  <module name="a">x<module name="b">y</module></module>\n</schema>'
    )
    assert schema_digest(reformatted) == DIGEST and len(DIGEST) == SCHEMA_DIGEST_BYTES
    changed = parse_schema('<schema name="s"><module name="a">x<module name="b">z</module></module></schema>')
    assert schema_digest(changed) != DIGEST


def test_keys_are_chunk_key_sized_and_depend_on_every_part() -> None:
    key = module_key(TENANT_A, DIGEST, ("a", "b"))
    assert len(key) == KEY_BYTES
    assert module_key(TENANT_B, DIGEST, ("a", "b")) != key  # a tenant never reads another's modules
    assert module_key(TENANT_A, bytes(SCHEMA_DIGEST_BYTES), ("a", "b")) != key
    assert module_key(TENANT_A, DIGEST, ("a",)) != key
    assert module_key(TENANT_A, DIGEST, ("ab",)) != module_key(TENANT_A, DIGEST, ("a", "b"))
    assert module_key(TENANT_A, DIGEST, ("a", "b"), scaffold="s") != key
    assert module_key(TENANT_A, DIGEST, ()) != module_key(TENANT_A, DIGEST, ("a",))


def test_keys_do_not_depend_on_the_process() -> None:
    script = (
        "from attnstore.chunks.keys import NamespaceSpec;"
        "from attnstore.prompt_modules import module_key, parse_schema, schema_digest;"
        "ns = NamespaceSpec('smollm2@1', 'bfloat16', 4, tenant_salt=b'tenant-a').namespace_id();"
        's = parse_schema(\'<schema name="s"><module name="a">x<module name="b">y</module></module></schema>\');'
        "print(module_key(ns, schema_digest(s), ('a', 'b')).hex())"
    )
    other = output_of(script, hash_seed=7)
    assert other == module_key(TENANT_A, DIGEST, ("a", "b")).hex()


def test_module_chunks_chain_from_the_module_key() -> None:
    key = module_key(TENANT_A, DIGEST, ("a",))
    tokens = list(range(10))
    chunks = module_chunk_keys(TENANT_A, key, tokens, 4)
    assert len(chunks) == 3  # the partial tail is kept: a module's KV is all of it
    assert chunks[0] == chunk_key(TENANT_A, key, tokens[:4])
    assert chunks[2] == chunk_key(TENANT_A, chunks[1], tokens[8:])
    assert module_chunk_keys(TENANT_A, module_key(TENANT_A, DIGEST, ("a", "b")), tokens, 4)[0] != chunks[0]


def test_malformed_key_parts_are_refused() -> None:
    with pytest.raises(ValueError, match="namespace"):
        module_key(b"short", DIGEST, ("a",))
    with pytest.raises(ValueError, match="digest"):
        module_key(TENANT_A, b"short", ("a",))
