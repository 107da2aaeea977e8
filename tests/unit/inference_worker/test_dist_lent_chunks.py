"""What a lender names the far KV it lends through its daemon (lent_chunks.py): keys per
chunk of a segment's positions, apart between workers (salts) and segments; a namespace
per KV layout."""

from __future__ import annotations

import torch

from inference_worker.dist_attention.lent_chunks import lent_keys, lent_namespace


def test_one_key_per_chunk_a_partial_last_one_included() -> None:
    keys = lent_keys(b"s" * 16, "seg", 100, 140, 16)  # chunks at 100, 116, 132 (8 tokens)
    assert len(keys) == 3 and len(set(keys)) == 3 and all(len(key) == 32 for key in keys)
    assert lent_keys(b"s" * 16, "seg", 116, 140, 16) == keys[1:]  # a key names its segment and position


def test_keys_differ_between_workers_and_segments() -> None:
    keys = lent_keys(b"a" * 16, "seg", 0, 16, 16)
    assert lent_keys(b"b" * 16, "seg", 0, 16, 16) != keys
    assert lent_keys(b"a" * 16, "seg2", 0, 16, 16) != keys


def test_one_namespace_per_layout() -> None:
    base = lent_namespace(3, 2, 16, torch.float32, 16)
    assert len(base) == 16 and base == lent_namespace(3, 2, 16, torch.float32, 16)
    others = {lent_namespace(4, 2, 16, torch.float32, 16), lent_namespace(3, 2, 16, torch.bfloat16, 16),
              lent_namespace(3, 2, 16, torch.float32, 32)}  # fmt: skip
    assert base not in others and len(others) == 3
