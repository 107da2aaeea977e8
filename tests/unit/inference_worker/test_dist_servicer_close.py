"""The micro-attention servicer's idle sweep (servicer.py) starts with the first segment
and stops at `close` (server shutdown), leaving no task behind."""

from __future__ import annotations

import asyncio

import torch

from attnstore.worker.v1 import micro_attention_pb2 as pb
from inference_worker.dist_attention.dgfm import DebtSwaps
from inference_worker.dist_attention.held_kv import HeldKV
from inference_worker.dist_attention.limits import MicroAttentionLimits
from inference_worker.dist_attention.long_settings import DgfmSettings
from inference_worker.dist_attention.remote import PeerChannels
from inference_worker.dist_attention.servicer import MicroAttentionServicer
from inference_worker.dist_attention.wire import to_wire


def _others() -> set[asyncio.Task[object]]:
    return asyncio.all_tasks() - {asyncio.current_task()}


async def test_close_stops_the_idle_sweep() -> None:
    held = HeldKV(MicroAttentionLimits(segment_idle_ttl_seconds=1))
    servicer = MicroAttentionServicer(
        DebtSwaps(held, DgfmSettings(), PeerChannels(None), 1), None, chunk_tokens=8
    )
    await servicer.close()  # before any segment: nothing to stop
    kv = to_wire(torch.zeros(2, 3, 1, 4))
    request = pb.AppendKVRequest(segment_id="s", start_position=0, keys=kv, values=kv, home="home:1")
    await servicer.AppendKV(request, None)  # type: ignore[arg-type]  # a named home: the context is not read
    sweeps = _others()
    assert len(sweeps) == 1 and not next(iter(sweeps)).done()
    await servicer.close()
    assert next(iter(sweeps)).cancelled() and not _others()
    await servicer.close()  # twice is harmless
