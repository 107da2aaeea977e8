import pytest
from hypothesis import given
from hypothesis import strategies as st
from other_interpreter import output_of

from attnstore.chunks.keys import KEY_BYTES, NamespaceSpec, chunk_key, chunk_key_chain

SPEC = NamespaceSpec(model_digest="smollm2-135m@abc", dtype="bfloat16", chunk_tokens=4)
TOKENS = list(range(1000, 1010))


def test_key_chain_is_identical_in_a_separate_process() -> None:
    # A fresh interpreter has a different hash seed; keys must not depend on it.
    script = (
        "from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain;"
        "ns = NamespaceSpec(model_digest='smollm2-135m@abc', dtype='bfloat16', chunk_tokens=4).namespace_id();"
        "print(','.join(k.hex() for k in chunk_key_chain(ns, list(range(1000, 1010)), 4, include_partial=True)))"
    )
    other = output_of(script, hash_seed=12345)
    here = chunk_key_chain(SPEC.namespace_id(), TOKENS, 4, include_partial=True)
    assert other == ",".join(k.hex() for k in here)


def test_chain_covers_full_chunks_and_optionally_the_tail() -> None:
    ns = SPEC.namespace_id()
    assert len(chunk_key_chain(ns, TOKENS, 4)) == 2
    full_and_tail = chunk_key_chain(ns, TOKENS, 4, include_partial=True)
    assert len(full_and_tail) == 3 and all(len(k) == KEY_BYTES for k in full_and_tail)


def test_partial_chunk_never_shares_a_key_with_a_full_chunk() -> None:
    ns = SPEC.namespace_id()
    assert chunk_key(ns, None, [1, 2, 3]) != chunk_key(ns, None, [1, 2, 3, 0])


def test_keys_are_chained_on_the_whole_prefix() -> None:
    ns = SPEC.namespace_id()
    a = chunk_key_chain(ns, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = chunk_key_chain(ns, [9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[1] != b[1]  # same second chunk, different history


@pytest.mark.parametrize(
    "other",
    [
        NamespaceSpec(model_digest="other-model", dtype="bfloat16", chunk_tokens=4),
        NamespaceSpec(model_digest="smollm2-135m@abc", dtype="float32", chunk_tokens=4),
        NamespaceSpec(model_digest="smollm2-135m@abc", dtype="bfloat16", chunk_tokens=8),
        NamespaceSpec(
            model_digest="smollm2-135m@abc", dtype="bfloat16", chunk_tokens=4, tenant_salt=b"tenant-b"
        ),
        NamespaceSpec(model_digest="smollm2-135m@abc", dtype="bfloat16", chunk_tokens=4, layout_version=2),
    ],
)
def test_everything_that_makes_kv_incompatible_changes_the_namespace(other: NamespaceSpec) -> None:
    assert other.namespace_id() != SPEC.namespace_id()
    assert chunk_key(other.namespace_id(), None, [1, 2]) != chunk_key(SPEC.namespace_id(), None, [1, 2])


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64), st.integers(1, 16))
def test_chain_is_a_prefix_function(tokens: list[int], chunk_tokens: int) -> None:
    ns = SPEC.namespace_id()
    whole = chunk_key_chain(ns, tokens, chunk_tokens)
    cut = len(tokens) // 2
    assert chunk_key_chain(ns, tokens[:cut], chunk_tokens) == whole[: cut // chunk_tokens]


def test_bad_inputs_are_refused() -> None:
    ns = SPEC.namespace_id()
    with pytest.raises(ValueError, match="namespace"):
        chunk_key(b"short", None, [1])
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        chunk_key(ns, None, [2**32])
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunk_key_chain(ns, [1], 0)
