"""Sequences whose oldest KV is not in the pool (DistAttention: on other workers,
dist_attention/context.py), run in the engine's batched steps beside the others.

Such a sequence's tokens in the engine are only its newest ones, at explicit positions
after the far part; their KV is in the pool as any sequence's. Per layer, the far part's
partial attention is started first (remote calls in flight), the pool's part is computed
with the rest of the batch's attention, as a partial (output and log-sum-exp: by the C decode kernel's entry point with log-sum-exp
for a decode row and a short run of prefill rows, each as a decode row whose context ends
at its own token; longer runs by torch's flash kernel over the gathered slots), and the
two merge exactly.

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


# Rows of one far sequence in a step that the C decode kernel attends (with log-sum-exp),
# each as a decode row whose context ends at its own token; more go through torch's flash
# kernel over the gathered slots. The kernel reads the KV once per row, the flash kernel
# once per chunk: SmolLM2's heads, one thread, load 7.6, kernel vs torch time at 256 /
# 1,024 / 4,096 context tokens: 1 row 0.40 / 0.38 / 0.07, 4 rows 0.27 / 0.50 / 0.51, 16 rows
# 0.47 / 0.93 / 1.05, 32 rows 0.68 / 1.04 / 1.37, 256 rows of 4,096 1.88.
KERNEL_MAX_ROWS = 4


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
    # [context] pool slots of its tokens so far, the new ones included; None when the decode
    # kernel attends its rows (`decode_index`: the first one's row in the step's DecodeTables)
    slots: torch.Tensor | None
    positions: range  # their positions
    decode_index: int | None = None


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
    lse: torch.Tensor | None,
) -> None:
    """Writes out[part.rows]: q's rows over the pool's part (k_pool, v_pool one layer of
    the pool [kv_heads, blocks, B, D]) merged with the far partial. A part with a
    `decode_index` has its pool part in out[part.rows] already, its log-sum-exp in
    lse[decode_index:] (the decode kernel's)."""
    if part.decode_index is not None:
        assert lse is not None
        rows = part.rows.stop - part.rows.start
        local = Partial(out[part.rows].float(), lse[part.decode_index : part.decode_index + rows])
    else:
        local = _pool_partial(q, k_pool, v_pool, part, scale=scale, window=window)
    out[part.rows] = merge([local, far()]).out.to(out.dtype)


def _pool_partial(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    part: FarRows,
    *,
    scale: float,
    window: int | None,
) -> Partial:
    """q's rows over the part's pool slots, gathered (torch's flash kernel with log-sum-exp)."""
    assert part.slots is not None
    kv_heads, dim = k_pool.shape[0], k_pool.shape[-1]
    keys = k_pool.view(kv_heads, -1, dim).index_select(1, part.slots).transpose(0, 1)  # [T, kv_heads, D]
    values = v_pool.view(kv_heads, -1, dim).index_select(1, part.slots).transpose(0, 1)  # [T, kv_heads, D]
    new = part.rows.stop - part.rows.start
    q_positions = part.positions[len(part.positions) - new :]
    return partial_attention(
        q[part.rows], keys, values, q_positions, part.positions, scale=scale, window=window
    )
