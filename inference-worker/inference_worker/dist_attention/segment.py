"""A segment: the KV of a run of consecutive positions of one sequence, every layer, in
this process's memory. The unit DistAttention places: a sequence's KV is a list of
segments, some here, some on peers (remote.py), each able to compute its partial.

    reserve(n) -> write(layer, k, v) for each layer -> the n new rows are visible

The buffers grow by doubling (preallocated otherwise), so appends copy amortised O(1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from inference_worker.dist_attention.partial import Partial, partial_attention


class KVPlace(Protocol):
    """Somewhere a part of a sequence's KV lives and its partial attention is computed."""

    @property
    def start(self) -> int: ...  # position of its first token

    @property
    def tokens(self) -> int: ...

    def partial(
        self, layer: int, q: torch.Tensor, q_positions: torch.Tensor, *, scale: float, window: int | None
    ) -> Partial: ...


class LocalSegment:
    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        *,
        start: int,
        capacity_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (layers, max(1, capacity_tokens), kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)  # [L, capacity, KVH, D]
        self.v = torch.empty(shape, dtype=dtype, device=device)  # [L, capacity, KVH, D]
        self.start = start
        self.tokens = 0

    @property
    def stop(self) -> int:
        return self.start + self.tokens

    @property
    def nbytes(self) -> int:
        return 2 * self.tokens * self.k[:, 0].numel() * self.k.element_size()

    def reserve(self, tokens: int) -> None:
        """Makes room for `tokens` more rows and counts them (written layer by layer next)."""
        needed = self.tokens + tokens
        if needed > self.k.shape[1]:
            grown = max(needed, 2 * self.k.shape[1])
            self.k = _grown(self.k, grown, self.tokens)
            self.v = _grown(self.v, grown, self.tokens)
        self.tokens = needed

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [n, KVH, D]: the last n reserved rows of `layer`."""
        rows = slice(self.tokens - k.shape[0], self.tokens)
        self.k[layer, rows] = k
        self.v[layer, rows] = v

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [L, n, KVH, D]: n more positions, every layer."""
        self.reserve(k.shape[1])
        self.k[:, self.tokens - k.shape[1] : self.tokens] = k
        self.v[:, self.tokens - k.shape[1] : self.tokens] = v

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of K, V [tokens, KVH, D] of `layer`."""
        return self.k[layer, : self.tokens], self.v[layer, : self.tokens]

    def positions(self) -> range:
        return range(self.start, self.stop)

    def partial(
        self, layer: int, q: torch.Tensor, q_positions: torch.Tensor, *, scale: float, window: int | None
    ) -> Partial:
        k, v = self.layer_kv(layer)
        return partial_attention(q, k, v, q_positions, self.positions(), scale=scale, window=window)


def _grown(buffer: torch.Tensor, capacity: int, used: int) -> torch.Tensor:
    grown = torch.empty(
        (buffer.shape[0], capacity, *buffer.shape[2:]), dtype=buffer.dtype, device=buffer.device
    )
    grown[:, :used] = buffer[:, :used]
    return grown


class RecalledSegment:
    """A segment of this worker's own sequence brought home by DGFM (dgfm.py): its KV is
    kept in the memory this worker lends (HeldKV, so it counts against max_held_bytes as
    the debtor's KV it replaced did) and attended here; `release` frees it there."""

    def __init__(self, segment: LocalSegment, release: Callable[[], object]) -> None:
        self.segment = segment
        self._release = release

    @property
    def start(self) -> int:
        return self.segment.start

    @property
    def tokens(self) -> int:
        return self.segment.tokens

    @property
    def nbytes(self) -> int:
        return self.segment.nbytes

    def partial(
        self, layer: int, q: torch.Tensor, q_positions: torch.Tensor, *, scale: float, window: int | None
    ) -> Partial:
        """Computed where the KV lies (HeldKV keeps it in host memory, the queries may be on
        a GPU), returned on the queries' device."""
        device = self.segment.k.device
        part = self.segment.partial(
            layer, q.to(device, self.segment.k.dtype), q_positions.to(device), scale=scale, window=window
        )
        return Partial(part.out.to(q.device), part.lse.to(q.device))

    def release(self) -> None:
        self._release()
