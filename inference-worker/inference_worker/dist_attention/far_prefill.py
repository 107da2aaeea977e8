"""The far part of a long sequence prefilled in the engine's batched steps, segment by
segment, and placed on peers (long_turn.py).

    LongContext.plan_far ──> per segment planned on a peer, oldest first:
        a prefill-only engine sequence of its tokens, at their positions, with the
        segments placed so far as its far KV (engine/far_kv.py) ──> chunked and batched
        with the other sequences' steps (token budget, preemption) ──> its KV copied out
        of its pool blocks ──> LongContext.add_far (AppendKV to the peer) ──> released
    a place lost meanwhile (a far partial's peer, or the upload's) ──> plan_far again
        over the peers left (ContextUnavailable when the context no longer fits)

Decision: a segment staged in the pool is at most the pool's capacity less one block (the
engine's bound on one sequence; long_turn.py caps `segment_tokens` so).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import structlog

from attnstore.chunks.keys import NAMESPACE_BYTES
from inference_worker.dist_attention.context import ContextUnavailable, LongContext
from inference_worker.dist_attention.placement import SegmentPlan
from inference_worker.dist_attention.segment import LocalSegment
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.engine import Engine
from inference_worker.engine.far_kv import FarKVLost
from inference_worker.engine.sequence import Sequence

log = structlog.get_logger("dist_attention.far_prefill")


async def place_far(engine: Engine, context: LongContext, token_ids: list[int], max_new_tokens: int) -> int:
    """Computes, in `engine`'s steps, the KV of the prompt's positions that `context` plans on
    peers and appends it there; the position where the tokens planned here start. Called
    again after a place was lost, it places them again over the peers left. Raises
    ContextTooLong, ContextUnavailable."""
    while True:
        far, start = await asyncio.to_thread(context.plan_far, token_ids, max_new_tokens)
        lost_before = len(context.lost)
        try:
            for index, plan in enumerate(far):
                segment = await _prefill(engine, context, plan)
                await asyncio.to_thread(context.add_far, index, plan, segment)
            return start
        except FarKVLost as lost:  # the context forgot the peer: planned again without it
            log.warning("far_prefill_place_lost", sequence=context.name, error=str(lost))
            if len(context.lost) == lost_before:  # no peer to leave out: it would fail again
                raise ContextUnavailable(f"sequence {context.name}: {lost}") from lost


async def _prefill(engine: Engine, context: LongContext, plan: SegmentPlan) -> LocalSegment:
    """`plan`'s KV, computed by a prefill-only engine sequence over the places so far."""
    stop = plan.start + plan.tokens
    seq = Sequence.of(
        context.token_ids[plan.start : stop], uuid.uuid4().bytes[:NAMESPACE_BYTES],  # shares no block
        positions=list(range(plan.start, stop)) if plan.start else None, far=context if plan.start else None,
    )  # fmt: skip
    try:
        async with contextlib.aclosing(engine.generate(seq)) as outputs:
            async for output in outputs:
                if output.preempted:  # a far partial's peer was lost (the context forgot it)
                    raise FarKVLost(f"sequence {context.name}: a peer was lost while positions "
                                    f"[{plan.start}, {stop}) were prefilled")  # fmt: skip
        # on a thread: a 4k-token SmolLM2 segment is ~190 MB to copy, the loop serves other turns
        return await asyncio.to_thread(copy_out, engine.runner.kv, seq.block_table, plan.start, plan.tokens)
    finally:
        engine.release(seq)


def copy_out(kv: PagedKV, table: list[int], start: int, tokens: int) -> LocalSegment:
    """The KV of a sequence's first `tokens` tokens (pool blocks `table`) as a segment at
    `start`. Read outside the engine's thread: the blocks are the finished sequence's until
    it is released, and nothing but the step writes the pool (no shared gather buffer)."""
    layers, kv_heads, _, _, dim = kv.k.shape
    slots = kv.slot_tensor(table, 0, tokens)
    segment = LocalSegment(layers, kv_heads, dim, start=start, capacity_tokens=tokens, dtype=kv.k.dtype,
                           device=kv.k.device)  # fmt: skip
    segment.reserve(tokens)
    for layer in range(layers):  # one layer's copy at a time
        k, v = kv.layer_span(layer, slots)  # [KVH, tokens, D]
        segment.write(layer, k.transpose(0, 1), v.transpose(0, 1))
    return segment
