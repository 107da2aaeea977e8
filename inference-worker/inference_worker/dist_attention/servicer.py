"""The gRPC edge of micro-attention (attnstore.worker.v1.MicroAttention): decodes and
checks tensors, runs HeldKV's work on a thread (torch releases the GIL, so the worker's
event loop keeps serving turns), encodes the partials. Domain errors become statuses at
the shared interceptor."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator

import grpc
import torch

from attnstore.errors import FailedPrecondition, InvalidArgument, ServiceError
from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore.server.peers import peer_host
from attnstore.worker.v1 import micro_attention_pb2 as pb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.daemon_source import read_chunks
from inference_worker.dist_attention.dgfm import DebtSwaps
from inference_worker.dist_attention.lent_chunks import LentChunks
from inference_worker.dist_attention.wire import from_wire, to_wire

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["MicroAttention"].full_name
# Idle segments are looked for every quarter of their TTL, within these bounds; the pins
# of the lent chunks (lent_chunks.py) last 4 sweeps, so 3 late ones still keep them.
_MIN_SWEEP_SECONDS, _MAX_SWEEP_SECONDS = 0.5, 30.0
_SWEEPS_PER_LEASE = 4


class MicroAttentionServicer(micro_attention_pb2_grpc.MicroAttentionServicer):
    def __init__(
        self,
        swaps: DebtSwaps,
        kvstore: AsyncKVStoreClient | None,
        chunk_tokens: int,
        kvstore_address: str = "",
    ) -> None:
        """`kvstore`: this node's daemon, through which every segment held here is lent
        (lent_chunks.py; None: lent outside any ledger); `chunk_tokens`: tokens per chunk
        put there; `kvstore_address`: the daemon's address as other workers reach it,
        reported in DescribeLending (long_context.advertise_kvstore_address; empty: none)."""
        self._swaps = swaps
        self._held = swaps.held
        self._kvstore = kvstore
        self._kvstore_address = kvstore_address
        self._sweep_seconds = min(
            max(self._held.limits.segment_idle_ttl_seconds / 4, _MIN_SWEEP_SECONDS), _MAX_SWEEP_SECONDS
        )
        self._lent = LentChunks(kvstore, chunk_tokens, math.ceil(self._sweep_seconds * _SWEEPS_PER_LEASE))
        self._sweeper: asyncio.Task[None] | None = None

    async def AppendKV(
        self, request: pb.AppendKVRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendKVResponse:
        self._start_sweeping()
        k = from_wire(request.keys, "keys", 4)
        v = from_wire(request.values, "values", 4)
        segment = await asyncio.to_thread(
            self._held.append, request.segment_id, request.start_position, k, v, request.home
        )
        try:
            # an unnamed home counts against its host, as a daemon's borrower defaults to its host name
            borrower = request.home or peer_host(context.peer())[1]
            namespace, keys = await self._lent.put(request.segment_id, request.start_position, k, v, borrower)
        except ServiceError:
            # Not lent through the ledger, not held: the home places the segment elsewhere.
            self._held.release(request.segment_id)
            raise
        finally:
            await self._lent.delete_released(self._held.holds)  # the append may have dropped idle segments
        return pb.AppendKVResponse(
            segment_tokens=segment.tokens, held_bytes=self._held.held_bytes, chunk_namespace=namespace,
            chunk_keys=keys,
        )  # fmt: skip

    def _start_sweeping(self) -> None:
        """Segments whose home died are dropped after the idle TTL even when no other call
        comes (their chunks deleted: the ledger stops counting them); started by the first
        segment, on the server's loop."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_seconds)
            self._held.drop_idle()
            await self._lent.delete_released(self._held.holds)
            await self._lent.renew()

    async def close(self) -> None:
        """Stops the idle sweep (at server shutdown): the task would outlive the server."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None

    async def pool_daemon(self) -> str:
        """The ledger id of the daemon this worker lends through ("": none, or not yet known)."""
        return await self._lent.pool_daemon()

    def held_for(self) -> dict[str, int]:
        """Bytes held here per borrower (its home), this worker's own KV left out."""
        return self._held.held_for()

    async def PartialAttention(
        self, request: pb.PartialAttentionRequest, context: grpc.aio.ServicerContext
    ) -> pb.PartialAttentionResponse:
        q = from_wire(request.queries, "queries", 3)
        positions = torch.tensor(list(request.query_positions), dtype=torch.long)
        if positions.numel() != q.shape[0]:
            raise InvalidArgument(f"{q.shape[0]} queries but {positions.numel()} query_positions")
        lent = await asyncio.to_thread(
            self._held.partial, [request.segment_id, *request.more_segment_ids], request.layer, q, positions,
            scale=request.scale, window=request.window or None,
        )  # fmt: skip
        return pb.PartialAttentionResponse(
            output=to_wire(lent.partial.out),
            lse=to_wire(lent.partial.lse),
            compute_ms=lent.compute_seconds * 1000,
            inflight_key_tokens=lent.inflight_key_tokens,
            layer_digests=lent.layer_digests,
        )

    async def ReadKV(
        self, request: pb.ReadKVRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadKVResponse]:
        for start, k, v in self._held.read(request.segment_id, request.layer, request.piece_tokens):
            yield pb.ReadKVResponse(start_position=start, keys=to_wire(k), values=to_wire(v))

    async def AttachChunks(
        self, request: pb.AttachChunksRequest, context: grpc.aio.ServicerContext
    ) -> pb.AttachChunksResponse:
        if self._kvstore is None:
            raise FailedPrecondition("this worker has no KV-store daemon (kvstore_address is unset)")
        self._start_sweeping()
        start, k, v = await read_chunks(self._kvstore, request.namespace, request.chunk_keys)
        segment = await asyncio.to_thread(self._held.append, request.segment_id, start, k, v, request.home)
        await self._lent.remember(request.segment_id, request.namespace, list(request.chunk_keys))
        await self._lent.delete_released(self._held.holds)
        return pb.AttachChunksResponse(
            segment_tokens=segment.tokens, start_position=segment.start, held_bytes=self._held.held_bytes,
            layer_digests=self._held.layer_digests(request.segment_id),
        )  # fmt: skip

    async def ReleaseKV(
        self, request: pb.ReleaseKVRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseKVResponse:
        released = self._held.release(request.segment_id)
        await self._lent.delete_released(self._held.holds)
        return pb.ReleaseKVResponse(released=released)

    async def DescribeLending(
        self, request: pb.DescribeLendingRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeLendingResponse:
        held_for = [pb.HeldFor(home=home, bytes=size) for home, size in sorted(self._held.held_for().items())]
        return pb.DescribeLendingResponse(
            held_bytes=self._held.held_bytes, max_held_bytes=self._held.limits.max_held_bytes,
            node=self._held.node, held_for=held_for, kvstore_address=self._kvstore_address,
            pool_daemon=await self.pool_daemon(),
        )  # fmt: skip

    async def RecallKV(
        self, request: pb.RecallKVRequest, context: grpc.aio.ServicerContext
    ) -> pb.RecallKVResponse:
        moved = await asyncio.to_thread(self._swaps.recall, request.creditor, request.max_bytes)
        return pb.RecallKVResponse(moved_bytes=moved)


def add_to_server(
    swaps: DebtSwaps,
    kvstore: AsyncKVStoreClient | None,
    chunk_tokens: int,
    server: grpc.aio.Server,
    kvstore_address: str = "",
) -> MicroAttentionServicer:
    """Registers the service (what `swaps.held` lends, DGFM's recalls; the rest as in
    MicroAttentionServicer); the servicer, to close at shutdown (its health name is
    SERVICE_NAME)."""
    servicer = MicroAttentionServicer(swaps, kvstore, chunk_tokens, kvstore_address)
    micro_attention_pb2_grpc.add_MicroAttentionServicer_to_server(servicer, server)
    return servicer
