"""The index of committed chunks: every entry by key, how many each namespace holds (a
namespace is reclaimed only while it holds none), and what it holds for pool borrowers
(chunks a peer placed here: bytes per borrower node, for the lending limits; their keys in
the order they came, evicted before this node's own; and the ones evicted, for the pool
member to tell their borrowers)."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator

from kvstore_daemon import metrics
from kvstore_daemon.chunk_entry import Chunk

_MAX_DROPS_KEPT = 65536


class ChunkIndex:
    """Owns the `Chunk` entries; the store and the tier mover change them only through it.
    An entry stays until its chunk has left every tier, deleted ones (hidden, still read)
    included."""

    def __init__(self) -> None:
        self._chunks: dict[bytes, Chunk] = {}
        self._per_namespace: Counter[bytes] = Counter()
        self._lent: Counter[str] = Counter()  # bytes per borrower node
        self._borrowed: dict[bytes, None] = {}  # keys held for borrowers, least recently placed or read first
        # (borrower node, key) of borrowed chunks evicted (not deleted); bounded: without a
        # ledger to drain it, the oldest are forgotten.
        self._dropped_borrowed: deque[tuple[str, bytes]] = deque(maxlen=_MAX_DROPS_KEPT)

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
        if chunk.borrower:
            self._lend(chunk.borrower, chunk.size_bytes)
            self._borrowed[chunk.key] = None

    def remove(self, chunk: Chunk) -> None:
        del self._chunks[chunk.key]
        self._per_namespace[chunk.namespace] -= 1
        if not self._per_namespace[chunk.namespace]:
            del self._per_namespace[chunk.namespace]
        if chunk.borrower:
            self._lend(chunk.borrower, -chunk.size_bytes)
            del self._borrowed[chunk.key]
            if not chunk.deleted:
                self._dropped_borrowed.append((chunk.borrower, chunk.key))

    def borrowed_keys(self) -> Iterator[bytes]:
        """Keys held for pool borrowers, least recently placed or read first."""
        return iter(self._borrowed)

    def note_borrowed_read(self, key: bytes) -> None:
        """A borrowed chunk was read: it goes last among the borrowed."""
        if self._borrowed.pop(key, 0) is None:
            self._borrowed[key] = None

    def take_dropped_borrowed(self) -> list[tuple[str, bytes]]:
        """(borrower node, key) of borrowed chunks evicted since the last call (not deleted
        by their borrower, nor dropped as corrupt: a read tells the borrower those)."""
        dropped = list(self._dropped_borrowed)
        self._dropped_borrowed.clear()
        return dropped

    def _lend(self, borrower: str, delta_bytes: int) -> None:
        self._lent[borrower] += delta_bytes
        if self._lent[borrower]:
            metrics.LENT_BYTES.labels(borrower).set(self._lent[borrower])
        else:
            del self._lent[borrower]
            metrics.LENT_BYTES.remove(borrower)

    @property
    def lent_bytes(self) -> int:
        """Bytes of chunks held for pool borrowers (deleted ones still read included)."""
        return sum(self._lent.values())

    def holds_namespace(self, namespace: bytes) -> bool:
        return namespace in self._per_namespace
