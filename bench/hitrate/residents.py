"""The resident keys of a one-tier model policy (learned_density.py, lhd.py), with LHD's
victim choice: the lowest density of a random sample (the deepest among ties), then its
deepest resident descendant, so that prefixes stay whole."""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable

Key = Hashable
SAMPLES = 64


class Residents:
    def __init__(self, seed: int = 0) -> None:
        self.depth: dict[Key, int] = {}  # key -> its depth in its chain (kept after it leaves)
        self._keys: list[Key] = []
        self._at: dict[Key, int] = {}  # resident key -> its index in _keys
        self._rng = random.Random(seed)

    def __contains__(self, key: Key) -> bool:
        return key in self._at

    def add(self, key: Key, depth: int) -> None:
        self.depth[key] = depth
        self._at[key] = len(self._keys)
        self._keys.append(key)

    def remove(self, key: Key) -> None:
        index = self._at.pop(key)
        last = self._keys.pop()
        if index < len(self._keys):
            self._keys[index] = last
            self._at[last] = index

    def victim(self, density: Callable[[Key], float], children: dict[Key, set[Key]]) -> Key:
        best: Key = None
        best_rank = (0.0, 0)
        for _ in range(SAMPLES):
            key = self._keys[self._rng.randrange(len(self._keys))]
            rank = (density(key), -self.depth[key])
            if best is None or rank < best_rank:
                best, best_rank = key, rank
        while kids := [child for child in children.get(best, ()) if child in self._at]:
            best = max(kids, key=self.depth.__getitem__)
        return best
