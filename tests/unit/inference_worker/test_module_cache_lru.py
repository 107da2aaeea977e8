"""The worker's in-memory module KV cache: least recently used out within its byte budget,
a KV larger than the budget not kept, a budget of 0 keeps nothing."""

from __future__ import annotations

import torch

from inference_worker.modules.module_cache import ModuleCache


def kv(tokens: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`layers` layers of K, V [1 kv head, tokens, 4]: 32 bytes a token a layer, K and V."""
    return [(torch.full((1, tokens, 4), float(tokens)), torch.zeros(1, tokens, 4)) for _ in range(layers)]


def test_least_recently_used_goes_first_within_the_budget() -> None:
    cache = ModuleCache(capacity_bytes=3 * 10 * 64)  # three KVs of 10 tokens (640 bytes each)
    for name in (b"a", b"b", b"c"):
        cache.put((b"ns", name), kv(10))
    assert cache.used_bytes == 3 * 640
    assert cache.get((b"ns", b"a")) is not None  # a is now the most recently used
    cache.put((b"ns", b"d"), kv(10))
    assert cache.get((b"ns", b"b")) is None  # the least recently used went
    assert [cache.get((b"ns", n)) is not None for n in (b"a", b"c", b"d")] == [True, True, True]
    assert cache.used_bytes == 3 * 640


def test_keys_are_per_namespace_and_replacing_counts_once() -> None:
    cache = ModuleCache(capacity_bytes=10_000)
    cache.put((b"tenant-a", b"m"), kv(10))
    assert cache.get((b"tenant-b", b"m")) is None  # another tenant's namespace never names it
    cache.put((b"tenant-a", b"m"), kv(5))
    got = cache.get((b"tenant-a", b"m"))
    assert got is not None and got[0][0].shape[1] == 5 and cache.used_bytes == 320
    cache.discard((b"tenant-a", b"m"))
    assert cache.get((b"tenant-a", b"m")) is None and cache.used_bytes == 0


def test_a_kv_over_the_budget_is_not_kept_and_zero_keeps_nothing() -> None:
    cache = ModuleCache(capacity_bytes=640)
    cache.put((b"ns", b"small"), kv(10))
    cache.put((b"ns", b"big"), kv(11))  # 704 bytes: over the whole budget
    assert cache.get((b"ns", b"big")) is None and cache.get((b"ns", b"small")) is not None
    off = ModuleCache(capacity_bytes=0)
    off.put((b"ns", b"m"), kv(1))
    assert off.get((b"ns", b"m")) is None and off.used_bytes == 0
