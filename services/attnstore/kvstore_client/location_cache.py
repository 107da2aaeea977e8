"""Where chunks lay in the daemon's arena when this client last leased them, so a later
whole-chunk read of the same chunks can skip the GetShm round trip.

An entry is a guess, never trusted on its own: it is read through a version-checked
copy (attnstore.shm_arena.BlockVersions) and dropped when the check fails, after which
the read takes a lease as usual. Bounded, least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from attnstore.shm_arena import BlockVersions, Extent

DEFAULT_ENTRIES = 4096  # ~1 KB each; a worker re-reads a few sessions' prefixes


@dataclass(frozen=True)
class KnownLocation:
    size_bytes: int
    extents: tuple[Extent, ...]
    blocks: tuple[int, ...]
    versions: tuple[int, ...]  # of `blocks`, read while the chunk was leased


class LocationCache:
    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must not be negative, got {max_entries}")
        self._max_entries = max_entries
        self._generation = ""  # the arena the entries refer to
        self._entries: OrderedDict[tuple[bytes, bytes], KnownLocation] = OrderedDict()

    def remember(
        self,
        generation: str,
        namespace: bytes,
        keys: Sequence[bytes],
        chunks: Sequence[tuple[int, Sequence[Extent]]],  # (size_bytes, extents) per key
        versions: BlockVersions,
    ) -> None:
        """Records leased chunks; call while the lease holds, so the versions are theirs."""
        if not self._max_entries:
            return
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation
        for key, (size_bytes, extents) in zip(keys, chunks, strict=True):
            blocks = versions.blocks_of(extents)
            self._entries[namespace, key] = KnownLocation(
                size_bytes, tuple(extents), blocks, versions.read(blocks)
            )
            self._entries.move_to_end((namespace, key))
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def find(self, generation: str, namespace: bytes, keys: Sequence[bytes]) -> list[KnownLocation] | None:
        """The locations of every key in `generation`'s arena, or None if any is unknown."""
        if generation != self._generation:
            return None
        found = []
        for key in keys:
            known = self._entries.get((namespace, key))
            if known is None:
                return None
            self._entries.move_to_end((namespace, key))
            found.append(known)
        return found

    def forget(self, namespace: bytes, keys: Sequence[bytes]) -> None:
        for key in keys:
            self._entries.pop((namespace, key), None)
