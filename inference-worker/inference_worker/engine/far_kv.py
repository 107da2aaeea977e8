"""Sequences whose oldest KV is not in the pool (DistAttention: on other workers,
dist_attention/context.py), run in the engine's batched steps beside the others.

Such a sequence's tokens in the engine are only its newest ones, at explicit positions
after the far part; their KV is in the pool as any sequence's. Per layer, the far part's
partial attention is started first (remote calls in flight), the pool's part is computed
with the rest of the batch's attention, as a partial (output and log-sum-exp, the torch
path: the C decode kernel returns no log-sum-exp), and the two merge exactly.

    step: far.frozen held ──> per layer: far.attend(...) started ──> the batch's attention
          ──> pool partial of the far rows ──> merge with the far partial ──> out
    a far place lost (FarKVLost) ──> the step is abandoned, the sequence handed back to
          its owner, which re-places its far KV and submits it again (engine.py)
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from inference_worker.dist_attention.partial import Partial, merge, partial_attention

if TYPE_CHECKING:
    from inference_worker.engine.sequence import Sequence


class FarKVLost(Exception):
    """A place holding part of a sequence's far KV is gone (a peer died or lost it)."""


class FarKV(Protocol):
    """The KV of positions [0, far_tokens) of a sequence, kept outside the pool."""

    # Held for a whole step: the far KV does not move meanwhile (DGFM moves it between steps).
    frozen: AbstractContextManager[object]

    def attend(
        self, layer: int, q: torch.Tensor, positions: torch.Tensor, *, scale: float, window: int | None
    ) -> Callable[[], Partial]:
        """Starts the partial of q [Q, H, D] at `positions` [Q] over every far place of
        `layer`; calling the result waits for it. Raises FarKVLost (either call)."""
        ...


@dataclass(frozen=True)
class FarRows:
    """One far sequence's share of a step: its rows and where its pool KV lies."""

    seq: Sequence
    far: FarKV  # seq.far
    rows: slice  # its new tokens' rows in the flattened batch
    slots: torch.Tensor  # [context] pool slots of its tokens so far, the new ones included
    positions: range  # their positions


def attend_far(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    part: FarRows,
    far: Callable[[], Partial],
    out: torch.Tensor,
    *,
    scale: float,
    window: int | None,
) -> None:
    """Writes out[part.rows]: q's rows over the pool's part (k_pool, v_pool one layer of
    the pool [kv_heads, blocks, B, D]) merged with the far partial."""
    kv_heads, dim = k_pool.shape[0], k_pool.shape[-1]
    keys = k_pool.view(kv_heads, -1, dim).index_select(1, part.slots).transpose(0, 1)  # [T, kv_heads, D]
    values = v_pool.view(kv_heads, -1, dim).index_select(1, part.slots).transpose(0, 1)  # [T, kv_heads, D]
    new = part.rows.stop - part.rows.start
    q_positions = part.positions[len(part.positions) - new :]
    local = partial_attention(
        q[part.rows], keys, values, q_positions, part.positions, scale=scale, window=window
    )
    out[part.rows] = merge([local, far()]).out.to(out.dtype)
