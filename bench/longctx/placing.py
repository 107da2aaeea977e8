"""The cost of placing a far segment on a peer, each way: appended to the peer worker
(AppendKV, the default: the peer, which has a daemon, puts each piece there as chunks lent
to the home before answering: lent_chunks.py) vs attached through the peer's daemon
(attach.py: the chunks put there by the home as lent to it, durable, then read once by the
worker, every layer checked).

Bytes are payload bytes from the home: the KV once when appended (the peer's put to its
own daemon goes over the node's shared memory); the chunks (KV plus headers) twice when
attached (home to daemon, daemon to worker). Times are wall times of the whole placement
as a long turn pays it, the fastest of `repeats` (both ways interleaved), from KV already
computed here: for attaching, encoding the chunks, registering the namespace, the durable
put, AttachChunks and the digest check; for appending, the pieces' AppendKV calls (the
peer's put included) and the digests; beside them, appending to a peer without a daemon
(nothing lent through a ledger: the default before every far segment was lent).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import grpc
import torch

from attnstore.chunks.keys import NAMESPACE_BYTES
from attnstore.worker.v1 import micro_attention_pb2 as pb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.attach import ChunkAttacher, segment_chunks
from inference_worker.dist_attention.remote import RemoteSegment
from inference_worker.dist_attention.runner import DistributedRunner

CHUNK_TOKENS = 256  # the worker's default chunk_tokens
_TIMEOUT_SECONDS = 120.0


def bench_placing(
    runner: DistributedRunner,
    address: str,
    channel: grpc.Channel,
    unlent: tuple[str, grpc.Channel],
    sizes: list[int],
    repeats: int,
) -> dict[str, Any]:
    """Per size (tokens): bytes moved and the fastest placement each way on the peer at
    `address`, which must advertise its daemon; beside them, appending to the `unlent`
    peer (address, channel), which has no daemon: the append before it lent through one
    (what the ledger's accounting costs)."""
    stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
    attacher = ChunkAttacher(None, None, chunk_tokens=CHUNK_TOKENS, timeout_seconds=_TIMEOUT_SECONDS)
    attacher.learn(address, stub.DescribeLending(pb.DescribeLendingRequest(), timeout=_TIMEOUT_SECONDS))
    if address not in attacher.daemons:
        raise RuntimeError(f"peer {address} advertises no daemon: nothing to attach through")
    rows = {}
    for tokens in sizes:
        staged = runner.new_segment(0, tokens)  # random KV: placing costs do not depend on values
        staged.reserve(tokens)
        staged.k.normal_(), staged.v.normal_()
        token_ids = torch.randint(0, 1000, (tokens,)).tolist()
        best = {"append": float("inf"), "attach": float("inf"), "unlent": float("inf")}
        for attempt in range(repeats):
            for way, (peer, peer_channel) in (("append", (address, channel)), ("unlent", unlent)):
                started = time.perf_counter()
                place = RemoteSegment.upload(peer, peer_channel, f"place-{tokens}-{way}-{attempt}", staged,
                                             _TIMEOUT_SECONDS, home="bench")  # fmt: skip
                best[way] = min(best[way], time.perf_counter() - started)
                place.release()
            namespace = uuid.uuid4().bytes[:NAMESPACE_BYTES]  # fresh: nothing already stored
            started = time.perf_counter()
            attached = attacher.attach(address, channel, f"place-{tokens}-attach-{attempt}", staged, token_ids,
                                       namespace, "bench")  # fmt: skip
            if attached is None:
                raise RuntimeError(f"attaching {tokens} tokens on {address} failed (the log says why)")
            best["attach"] = min(best["attach"], time.perf_counter() - started)
            attached.release()  # the worker deletes the chunks from its daemon
        _, chunks = segment_chunks(b"\0" * NAMESPACE_BYTES, token_ids, staged, CHUNK_TOKENS)
        append_bytes, attach_bytes = staged.nbytes, 2 * sum(map(len, chunks))
        rows[f"{tokens // 1024}k"] = {
            "append": {"ms": best["append"] * 1e3, "bytes": append_bytes},
            "attach": {"ms": best["attach"] * 1e3, "bytes": attach_bytes},
            "append_unlent": {"ms": best["unlent"] * 1e3, "bytes": append_bytes},
            "time_ratio_attach_vs_append": best["attach"] / best["append"],
            "time_ratio_append_vs_unlent": best["append"] / best["unlent"],
            "bytes_ratio_attach_vs_append": attach_bytes / append_bytes,
        }
        del staged
    return rows
