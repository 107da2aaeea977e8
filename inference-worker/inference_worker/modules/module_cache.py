"""Module KV kept in the worker's memory across turns, by where it is stored (the store's
namespace and the module's key): a module a turn finds stored in the daemon is served from
here instead of read again, when an earlier turn read it. The daemon stays the
store of record: a module is served from here only after the turn's lookup found all its
chunks stored (an evicted module is encoded again, as without this cache, and the daemon's
policies see every use). Its KV is what a complete, verified read gave (the module key
names the schema's content, so it never goes stale). Decision: only reads fill it, not
encodings, so a module's first use after encoding is served as the daemon stores it (the
store's format, its checksums) and the worker holds only modules that prompts read again.

Why: a 3-document prompt's ~1,000 module tokens cost its turn four daemon reads (copies
out of shared memory, checksums verified) on the event loop beside the forward pass; from
memory the turn only attends them where they lie (prefix_in_place.py). Least recently used first out, within a
byte budget (the worker setting `module_cache_bytes`; 0: off).
"""

from __future__ import annotations

from collections import OrderedDict

from inference_worker.kv_saver import KV

CacheKey = tuple[bytes, bytes]  # (the store's namespace, the module key)


class ModuleCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[CacheKey, tuple[KV, int]] = OrderedDict()

    def get(self, key: CacheKey) -> KV | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: CacheKey, kv: KV) -> None:
        """Keeps `kv` (its tensors are never modified after), evicting the least recently
        used; a KV larger than the whole budget is not kept."""
        size = sum(k.nbytes + v.nbytes for k, v in kv)
        self.discard(key)
        if size > self.capacity_bytes:
            return
        while self.used_bytes + size > self.capacity_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.used_bytes -= evicted
        self._entries[key] = (kv, size)
        self.used_bytes += size

    def discard(self, key: CacheKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.used_bytes -= entry[1]
