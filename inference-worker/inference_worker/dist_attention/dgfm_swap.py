"""DGFM's swaps executed on real segments: around a cycle of debts (services/attnstore/
debt_graph.py plans it), each debtor's segments held by its creditor go home.

    debts_of(homes) ──plan_swaps──> Swap ──execute_swap──> relocate each segment:
        ReadKV every layer (from the creditor) ──> AppendKV (at home) ──> ReleaseKV (creditor)

A node is named by its MicroAttention address; a sequence's home is the node whose worker
runs it, and its KV "at home" is held by that node's own MicroAttention (the home attends
it next to the memory). Around a cycle every creditor frees what its debtor takes, so no
node holds more than before (the swap is sized by the cycle's smallest debt).

Decisions:
- Whole segments move (a segment is one AppendKV series and one release); a debtor's
  segments are recalled oldest first while they fit the swap's size, so a swap may move
  less than planned, never more (which would unbalance a node).
- The receiving node holds a moved segment before its own debtor's segments leave it:
  during a swap a node needs room for one debtor's recalled segments on top (moving them
  piece by piece, alternating around the cycle, would cut that to a piece; not done).
- Frozen while moving: a sequence is swapped between its steps, by the thread that steps
  it (LongContext is not thread-safe), so no step attends a segment halfway moved.
- The debts come from the sequences' placements here; a deployment records the same
  edges in the pool's ledger (PoolLedger.record_debt) for a global view.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import grpc

from attnstore.debt_graph import Edge, Swap
from inference_worker.dist_attention.context import LongContext
from inference_worker.dist_attention.remote import RemoteSegment
from inference_worker.dist_attention.segment import LocalSegment


def debts_of(homes: Mapping[str, Sequence[LongContext]]) -> dict[Edge, int]:
    """(debtor, creditor) -> bytes of the debtor's sequences' KV the creditor holds."""
    debts: dict[Edge, int] = defaultdict(int)
    for home, contexts in homes.items():
        for context in contexts:
            for place in context.places:
                if isinstance(place, RemoteSegment) and place.address != home:
                    debts[(home, place.address)] += place.nbytes
    return dict(debts)


def relocate(place: RemoteSegment, address: str, channel: grpc.Channel) -> RemoteSegment:
    """Moves a segment's KV to the worker at `address`: read layer by layer, appended there,
    released at its old holder. Raises remote.PlaceLost when either side fails (the old
    copy is released only once the new one holds everything)."""
    k, v = place.read_layer(0)  # [tokens, KVH, D]
    staging = LocalSegment(place.layers, k.shape[1], k.shape[2], start=place.start,
                           capacity_tokens=place.tokens, dtype=k.dtype, device=k.device)  # fmt: skip
    staging.reserve(place.tokens)
    for layer in range(place.layers):
        if layer:
            k, v = place.read_layer(layer)
        staging.k[layer], staging.v[layer] = k, v
    moved = RemoteSegment.upload(address, channel, place.segment_id, staging, place.timeout_seconds)
    place.release()
    return moved


def execute_swap(
    swap: Swap, homes: Mapping[str, Sequence[LongContext]], channels: Mapping[str, grpc.Channel]
) -> int:
    """Recalls each cycle member's segments from its creditor (Swap.moves); the bytes moved."""
    moved_bytes = 0
    for owner, creditor, size in swap.moves():
        budget = size
        for context in homes[owner]:
            for index, place in enumerate(context.places):
                if not isinstance(place, RemoteSegment) or place.address != creditor or place.nbytes > budget:
                    continue
                context.places[index] = relocate(place, owner, channels[owner])
                budget -= place.nbytes
                moved_bytes += place.nbytes
    return moved_bytes
