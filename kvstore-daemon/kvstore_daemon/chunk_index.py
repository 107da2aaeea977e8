"""The index of committed chunks: every entry by key, and how many each namespace holds
(a namespace is reclaimed only while it holds none)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from kvstore_daemon.chunk_entry import Chunk


class ChunkIndex:
    """Owns the `Chunk` entries; the store and the tier mover change them only through it.
    An entry stays until its chunk has left every tier, deleted ones (hidden, still read)
    included."""

    def __init__(self) -> None:
        self._chunks: dict[bytes, Chunk] = {}
        self._per_namespace: Counter[bytes] = Counter()

    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, key: bytes) -> bool:
        return key in self._chunks

    def __getitem__(self, key: bytes) -> Chunk:
        return self._chunks[key]

    def __iter__(self) -> Iterator[Chunk]:
        return iter(self._chunks.values())

    def get(self, key: bytes) -> Chunk | None:
        return self._chunks.get(key)

    def holds(self, chunk: Chunk) -> bool:
        """Whether this very entry is indexed (not one removed, nor a newer one of its key)."""
        return self._chunks.get(chunk.key) is chunk

    def add(self, chunk: Chunk) -> None:
        if chunk.key in self._chunks:
            raise KeyError(f"chunk {chunk.key.hex()} is indexed already")
        self._chunks[chunk.key] = chunk
        self._per_namespace[chunk.namespace] += 1

    def remove(self, chunk: Chunk) -> None:
        del self._chunks[chunk.key]
        self._per_namespace[chunk.namespace] -= 1
        if not self._per_namespace[chunk.namespace]:
            del self._per_namespace[chunk.namespace]

    def holds_namespace(self, namespace: bytes) -> bool:
        return namespace in self._per_namespace
