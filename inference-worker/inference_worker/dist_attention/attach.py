"""A far segment placed through its lender's KV-store daemon instead of appended to the
lender worker: the pool's lending path (the chunks land in the daemon of the node that
lends, counted as lent to the home), and the segments DGFM then recalls like appended ones.

    LongTurns.peer_room_tokens: each peer's DescribeLending.kvstore_address (checked) ──>
    LongContext.add_far, a segment planned on a peer with a daemon:
        register the turn's namespace there ──> put the segment's chunks as lent to the
        home (ReservePut.borrower, durable; the chunk format; keys chained over the turn's
        tokens) ──> AttachChunks(home) on the peer worker ──> its layer digests equal the
        home's of the KV put ──> RemoteSegment (it remembers the chunks: re-attached after
        the lender worker restarts, remote.py)
    the daemon refuses a chunk (its lending limits) or is silent, or AttachChunks fails:
    the chunks deleted again, the segment appended (AppendKV); the digests differ:
    PlaceLost (the KV is never attended)

Decisions:
- Keys chained over the turn's tokens: the segment's first key is chained to a key of all
  tokens before it (chunk_key's parent), so every key names its tokens and all before,
  whatever the segment's start (segments need not start on a chunk boundary).
- A random namespace per long turn and plan (LongContext.chunk_namespace): two turns over
  the same tokens, or one turn's KV recomputed after a loss, may differ in the last bits
  (other batches), and a segment must attach the exact KV the home hashed.
- The chunks stay in the daemon while the segment lives (the worker holds its own copy,
  read once; the chunks let it re-attach after a restart); the lender worker deletes them
  when it no longer holds the segment (servicer.py), else the daemon's eviction reclaims
  them (borrowed chunks first).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time

import grpc
import structlog

from attnstore.chunks.keys import chunk_key, chunk_key_chain
from attnstore.errors import InvalidArgument, ServiceError
from attnstore.kvstore_client import DaemonProtocolError, KVStoreClient
from attnstore.security import ClientCredentials
from attnstore.worker.v1 import micro_attention_pb2 as pb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.address import check_address
from inference_worker.dist_attention.cost_model import CostModel
from inference_worker.dist_attention.remote import AttachedChunks, RemoteSegment
from inference_worker.dist_attention.segment import LocalSegment
from inference_worker.kv_codec import DTYPE_NAMES, encode_chunks

log = structlog.get_logger("dist_attention.attach")


def segment_keys(
    namespace: bytes, token_ids: list[int], start: int, stop: int, chunk_tokens: int
) -> list[bytes]:
    """Keys of the chunks of positions [start, stop), chained over every token before."""
    parent = chunk_key(namespace, None, token_ids[:start]) if start else None
    return chunk_key_chain(
        namespace, token_ids[start:stop], chunk_tokens, include_partial=True, parent=parent
    )


def segment_chunks(
    namespace: bytes, token_ids: list[int], local: LocalSegment, chunk_tokens: int
) -> tuple[list[bytes], list[bytes]]:
    """The keys and chunks (the chunk format, a partial last one) of `local`'s KV."""
    keys = segment_keys(namespace, token_ids, local.start, local.stop, chunk_tokens)
    kv = [(k.transpose(0, 1), v.transpose(0, 1)) for k, v in map(local.layer_kv, range(local.k.shape[0]))]
    return keys, encode_chunks(namespace, keys, kv, chunk_tokens, local.start, include_partial=True)


class ChunkAttacher:
    def __init__(
        self,
        credentials: ClientCredentials | None,
        data_plane_tls: ssl.SSLContext | None,
        chunk_tokens: int,
        timeout_seconds: float,
    ) -> None:
        """`credentials`, `data_plane_tls`: how this worker reaches a daemon (its
        kvstore_channel: the pool's daemons share it); `chunk_tokens`: tokens per chunk put."""
        self.credentials = credentials
        self.data_plane_tls = data_plane_tls
        self.chunk_tokens = chunk_tokens
        self.timeout_seconds = timeout_seconds
        self.daemons: dict[str, str] = {}  # peer worker -> its daemon (DescribeLending.kvstore_address)

    def learn(self, peer: str, lending: pb.DescribeLendingResponse) -> None:
        """Records the daemon `peer` reports: none when it reports none or a malformed
        address (logged; its segments are then appended)."""
        self.daemons.pop(peer, None)
        if lending.kvstore_address:
            try:
                self.daemons[peer] = check_address(lending.kvstore_address, f"peer {peer}'s kvstore_address")
            except InvalidArgument as exc:
                log.warning("long_context_peer_daemon_malformed", peer=peer, error=str(exc))

    def attach(
        self,
        peer: str,
        channel: grpc.Channel,
        segment_id: str,
        local: LocalSegment,
        token_ids: list[int],
        namespace: bytes,
        home: str,
    ) -> RemoteSegment | None:
        """`local`'s KV as segment `segment_id` of `peer`, through its daemon; None when
        the peer has no daemon or the daemon or the peer refused (the caller appends).
        Raises PlaceLost when the peer attached other KV than the KV put."""
        daemon = self.daemons.get(peer)
        if daemon is None:
            return None
        stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
        layers, _, kv_heads, dim = local.k.shape
        keys, chunks = segment_chunks(namespace, token_ids, local, self.chunk_tokens)
        started = time.perf_counter()
        segment: RemoteSegment | None = None
        try:
            with KVStoreClient(daemon, credentials=self.credentials, data_plane_tls=self.data_plane_tls,
                               timeout_seconds=self.timeout_seconds) as client:  # fmt: skip
                client.register_namespace(namespace, num_layers=layers, kv_heads=kv_heads, head_dim=dim,
                                          chunk_tokens=self.chunk_tokens, dtype=DTYPE_NAMES[local.k.dtype])  # fmt: skip
                # Lent through the pool's lending path: the daemon counts the chunks as lent to
                # `borrower` (its lending limits, the ledger's lent_bytes) and keeps them on SSD.
                put = client.put_chunks(namespace, list(zip(keys, chunks, strict=True)), durable=True,
                                        borrower=borrower_name(home))  # fmt: skip
                try:
                    if put.no_space or put.in_progress:
                        raise _NotLent(f"{len(put.no_space)} of {len(keys)} chunks past its lending limits, "
                                       f"{len(put.in_progress)} in progress")  # fmt: skip
                    costs = CostModel()
                    costs.observe_transfer(sum(map(len, chunks)), time.perf_counter() - started)
                    segment = RemoteSegment.placed(peer, stub, segment_id, local, self.timeout_seconds, costs,
                                                   AttachedChunks(namespace, keys, home))  # fmt: skip
                    segment.attach()
                except (grpc.RpcError, _NotLent):
                    with contextlib.suppress(grpc.RpcError, ServiceError, DaemonProtocolError, OSError):
                        client.delete(namespace, keys)  # not lent after all
                    raise
        except (grpc.RpcError, ServiceError, DaemonProtocolError, OSError, _NotLent) as exc:
            log.warning(
                "far_segment_attach_failed", peer=peer, daemon=daemon, segment=segment_id, error=str(exc)
            )
            if segment is not None:  # an attach past its deadline may have been made
                segment.release()
            return None
        log.info("far_segment_attached", peer=peer, daemon=daemon, segment=segment_id, tokens=local.tokens)
        return segment


def borrower_name(home: str) -> str:
    """The borrower a lender's daemon counts a home's chunks against: its advertised
    address (the node DGFM names it by), else its host name (a daemon's default node)."""
    return home or socket.gethostname()


class _NotLent(Exception):
    """The lender's daemon did not take every chunk."""
