"""The gRPC edge of the daemon: checks requests, calls the chunk store, builds replies."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable

import grpc

from attnstore.errors import InvalidArgument
from attnstore.kvstore.v1 import kvstore_pb2 as pb
from attnstore.kvstore.v1 import kvstore_pb2_grpc
from attnstore.same_named import same_named
from attnstore.server.peers import peer_host
from kvstore_daemon import metrics
from kvstore_daemon.chunk_entry import ReserveStatus, TierName
from kvstore_daemon.chunk_store import ChunkStore
from kvstore_daemon.get_encoding import GetResponseWriter
from kvstore_daemon.hints import HintAction, HintSpec
from kvstore_daemon.namespaces import NamespaceLayout
from kvstore_daemon.settings import DaemonSettings
from kvstore_daemon.validation import (
    check_borrower,
    check_keys,
    check_layer_range,
    check_namespace,
    check_nonempty,
    check_ttl,
    check_unique_ids,
)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["KVStore"].full_name
# Control-plane calls (the scheduler's, operators'): with internal auth on they need an
# admin token. Delete is not among them: workers delete the stale chunks of a re-save.
ADMIN_METHODS = frozenset(f"/{SERVICE_NAME}/{name}" for name in ("Hint", "Pin", "Unpin", "Stats"))

_TIER = {TierName.DRAM: pb.TIER_DRAM, TierName.SSD: pb.TIER_SSD, TierName.PEER: pb.TIER_PEER}
_RESERVE_STATUS = {
    ReserveStatus.RESERVED: pb.RESERVE_STATUS_RESERVED,
    ReserveStatus.ALREADY_STORED: pb.RESERVE_STATUS_ALREADY_STORED,
    ReserveStatus.IN_PROGRESS: pb.RESERVE_STATUS_IN_PROGRESS,
    ReserveStatus.NO_SPACE: pb.RESERVE_STATUS_NO_SPACE,
}
_HINT_ACTION = {
    pb.HINT_ACTION_PREFETCH: HintAction.PREFETCH,
    pb.HINT_ACTION_PROTECT: HintAction.PROTECT,
    pb.HINT_ACTION_EVICT_FIRST: HintAction.EVICT_FIRST,
    pb.HINT_ACTION_PREDICT: HintAction.PREDICT,
    pb.HINT_ACTION_DECLINE: HintAction.DECLINE,
}
MAX_HINT_SOURCE_CHARS = 128


def _caller(peer: str) -> str:
    """The calling host ("ipv4:10.0.0.7"): a client's connections share its rate limits."""
    kind, host = peer_host(peer)
    return f"{kind}:{host}"


class KVStoreServicer(kvstore_pb2_grpc.KVStoreServicer):
    def __init__(
        self,
        store: ChunkStore,
        settings: DaemonSettings,
        data_plane_port: int = 0,
        pool_address: Callable[[], str] = str,
    ) -> None:
        """`pool_address`: this daemon's id in the pool's ledger ("" while none)."""
        self._store = store
        self._settings = settings
        self._data_plane_port = data_plane_port  # 0: off
        self._pool_address = pool_address

    def _keys(self, keys: list[bytes], *, unique: bool = True) -> list[bytes]:
        """Keys of one call, each at most once (a repeated key would be read and counted
        twice); only Hint may name a key in several entries."""
        return check_keys(keys, self._settings.max_keys_per_request, unique=unique)

    async def RegisterNamespace(
        self, request: pb.RegisterNamespaceRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterNamespaceResponse:
        if not request.HasField("layout"):
            raise InvalidArgument("layout is required")
        max_bytes = self._store.register_namespace(
            check_namespace(request.namespace),
            same_named(NamespaceLayout, request.layout),
            _caller(context.peer()),
        )
        return pb.RegisterNamespaceResponse(max_chunk_bytes=max_bytes)

    async def OpenShm(
        self, request: pb.OpenShmRequest, context: grpc.aio.ServicerContext
    ) -> pb.OpenShmResponse:
        dram = self._store.dram
        return pb.OpenShmResponse(
            path=str(dram.path),
            size_bytes=dram.size_bytes,
            block_bytes=dram.block_bytes,
            arena_generation=dram.generation,
            block_versions_offset_bytes=dram.versions_offset_bytes,
        )

    async def OpenDataPlane(
        self, request: pb.OpenDataPlaneRequest, context: grpc.aio.ServicerContext
    ) -> pb.OpenDataPlaneResponse:
        return pb.OpenDataPlaneResponse(
            port=self._data_plane_port,
            tls=self._settings.tls.enabled,
            max_frame_bytes=self._settings.data_plane_max_frame_bytes,
        )

    async def Lookup(self, request: pb.LookupRequest, context: grpc.aio.ServicerContext) -> pb.LookupResponse:
        keys = self._keys(request.keys)
        tiers = self._store.lookup(check_namespace(request.namespace), keys, request.promote)
        peers = [
            self._store.placed_on(key) if tier is TierName.PEER else "" for key, tier in zip(keys, tiers)
        ]
        return pb.LookupResponse(
            prefix_length=len(tiers), tiers=[_TIER[t] for t in tiers], peer_addresses=peers
        )

    async def ReservePut(
        self, request: pb.ReservePutRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReservePutResponse:
        namespace = check_namespace(request.namespace)
        check_nonempty(request.items, "items")
        keys = self._keys([item.key for item in request.items])
        ttl = check_ttl(
            request.ttl_seconds,
            self._settings.reservation_ttl_seconds,
            self._settings.reservation_ttl_seconds * 10,
            "ttl_seconds",
        )
        results = await self._store.reserve(
            namespace,
            [(key, item.size_bytes) for key, item in zip(keys, request.items, strict=True)],
            ttl,
            borrower=check_borrower(request.borrower),
        )
        return pb.ReservePutResponse(
            reservations=[
                pb.Reservation(
                    key=r.key,
                    status=_RESERVE_STATUS[r.status],
                    write_id=r.write_id,
                    extents=[pb.Extent(offset_bytes=o, length_bytes=n) for o, n in r.extents],
                )
                for r in results
            ],
            arena_generation=self._store.dram.generation,
        )

    async def WritePut(
        self, request_iterator: AsyncIterator[pb.WritePutRequest], context: grpc.aio.ServicerContext
    ) -> pb.WritePutResponse:
        written = 0
        async for piece in request_iterator:
            self._store.write(piece.write_id, piece.offset_bytes, piece.data)
            written += len(piece.data)
        metrics.BYTES_IN.labels("grpc").inc(written)
        return pb.WritePutResponse(bytes_written=written)

    async def CommitPut(
        self, request: pb.CommitPutRequest, context: grpc.aio.ServicerContext
    ) -> pb.CommitPutResponse:
        ids = check_unique_ids(request.write_ids, self._settings.max_keys_per_request, "write_ids")
        return pb.CommitPutResponse(committed_count=await self._store.commit(ids, request.durable))

    async def AbortPut(
        self, request: pb.AbortPutRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortPutResponse:
        ids = check_unique_ids(request.write_ids, self._settings.max_keys_per_request, "write_ids")
        return pb.AbortPutResponse(aborted_count=self._store.abort(ids))

    async def Get(self, request: pb.GetRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Yields serialized GetResponse messages (see get_encoding.py)."""
        namespace = check_namespace(request.namespace)
        keys = self._keys(request.keys)
        check_nonempty(keys, "keys")
        num_layers = self._store.namespaces.get(namespace).num_layers
        start, end = check_layer_range(request.layer_start, request.layer_end, num_layers)
        limit = self._settings.max_get_message_bytes
        sent = 0
        async with self._store.reading(namespace, keys) as chunks:
            message = GetResponseWriter()
            for chunk in chunks:
                message.add_header(self._store.header_bytes(chunk))
            # Layer-major: a reader can compute with layer l while l+1 is on the wire.
            for layer in range(start, end):
                for index, chunk in enumerate(chunks):
                    message.add_slice(index, layer, self._store.layer_views(chunk, layer, layer + 1))
                    if message.data_bytes >= limit:
                        sent += message.data_bytes
                        yield message.take()
            sent += message.data_bytes
            yield message.take()
        metrics.BYTES_OUT.labels("grpc").inc(sent)

    async def GetShm(self, request: pb.GetShmRequest, context: grpc.aio.ServicerContext) -> pb.GetShmResponse:
        namespace = check_namespace(request.namespace)
        keys = self._keys(request.keys)
        check_nonempty(keys, "keys")
        ttl = check_ttl(
            request.lease_ttl_seconds,
            self._settings.lease_ttl_seconds,
            self._settings.max_lease_ttl_seconds,
            "lease_ttl_seconds",
        )
        releases = check_unique_ids(
            request.release_lease_ids,
            self._settings.max_keys_per_request,
            "release_lease_ids",
            allow_empty=True,
        )
        for lease_id in releases:  # before the new lease: the reader is done with these
            self._store.release_lease(lease_id)
        lease = await self._store.lease(namespace, keys, ttl)
        metrics.BYTES_OUT.labels("shm").inc(sum(c.size_bytes for c in lease.chunks))
        return pb.GetShmResponse(
            lease_id=lease.lease_id,
            chunks=[
                pb.ChunkLocation(
                    size_bytes=c.size_bytes,
                    extents=[pb.Extent(offset_bytes=o, length_bytes=n) for o, n in c.extents or []],
                )
                for c in lease.chunks
            ],
            arena_generation=self._store.dram.generation,
            lease_ttl_ms=int(ttl * 1000),
        )

    async def ReleaseLease(
        self, request: pb.ReleaseLeaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseLeaseResponse:
        limit = self._settings.max_keys_per_request
        reads = [
            (
                check_namespace(r.namespace),
                check_keys(r.keys, limit, field=f"lease_free_reads[{i}].keys", unique=True),
            )
            for i, r in enumerate(request.lease_free_reads)
        ]
        if sum(len(keys) for _, keys in reads) > limit:
            raise InvalidArgument(
                f"lease_free_reads name more than {limit} keys in all; at most {limit} per call"
            )
        ids = check_unique_ids(request.lease_ids, limit, "lease_ids", allow_empty=bool(reads))
        for namespace, _ in reads:  # every check before any change
            self._store.namespaces.get(namespace)
        for namespace, keys in reads:
            self._store.note_lease_free_reads(namespace, keys)
        return pb.ReleaseLeaseResponse(released_count=sum(self._store.release_lease(i) for i in ids))

    async def Delete(self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext) -> pb.DeleteResponse:
        count = self._store.delete(check_namespace(request.namespace), self._keys(request.keys))
        return pb.DeleteResponse(deleted_count=count)

    async def Pin(self, request: pb.PinRequest, context: grpc.aio.ServicerContext) -> pb.PinResponse:
        ttl = check_ttl(
            request.ttl_seconds,
            self._settings.pin_ttl_seconds,
            self._settings.max_pin_ttl_seconds,
            "ttl_seconds",
        )
        count = self._store.pin(check_namespace(request.namespace), self._keys(request.keys), ttl)
        return pb.PinResponse(pinned_count=count)

    async def Unpin(self, request: pb.UnpinRequest, context: grpc.aio.ServicerContext) -> pb.UnpinResponse:
        count = self._store.unpin(check_namespace(request.namespace), self._keys(request.keys))
        return pb.UnpinResponse(unpinned_count=count)

    async def Hint(self, request: pb.HintRequest, context: grpc.aio.ServicerContext) -> pb.HintResponse:
        namespace = check_namespace(request.namespace)
        self._keys([key for entry in request.entries for key in entry.keys], unique=False)
        entries = []
        for index, entry in enumerate(request.entries):
            action = _HINT_ACTION.get(entry.action)
            if action is None:
                raise InvalidArgument(
                    f"entries[{index}].action must be PREFETCH, PROTECT, PREDICT, EVICT_FIRST or DECLINE"
                )
            if not 0 <= entry.next_use_seconds < math.inf:
                raise InvalidArgument(
                    f"entries[{index}].next_use_seconds must be finite and not negative, got {entry.next_use_seconds}"
                )
            entries.append(HintSpec(list(entry.keys), action, entry.queue_position, entry.next_use_seconds))
        if len(request.source) > MAX_HINT_SOURCE_CHARS:
            raise InvalidArgument(f"source must be at most {MAX_HINT_SOURCE_CHARS} characters")
        ttl = check_ttl(
            request.ttl_seconds,
            self._settings.hint_ttl_seconds,
            self._settings.hint_ttl_seconds * 10,
            "ttl_seconds",
        )
        hinted, started = self._store.hint(namespace, entries, request.replace, ttl, request.source)
        return pb.HintResponse(hinted_keys=hinted, prefetches_started=started)

    async def Stats(self, request: pb.StatsRequest, context: grpc.aio.ServicerContext) -> pb.StatsResponse:
        s = self._store.stats()
        return same_named(
            pb.StatsResponse,
            s,
            dram=pb.TierStats(
                capacity_bytes=s.dram_capacity_bytes,
                used_bytes=s.dram_used_bytes,
                chunks=s.dram_chunks,
                hits=s.hits[TierName.DRAM],
                evictions=s.evictions[TierName.DRAM],
            ),
            ssd=pb.TierStats(
                capacity_bytes=s.ssd_capacity_bytes,
                used_bytes=s.ssd_used_bytes,
                chunks=s.ssd_chunks,
                hits=s.hits[TierName.SSD],
                evictions=s.evictions[TierName.SSD],
            ),
            eviction_policy=self._settings.eviction_policy,
            namespaces_refused_table_full=s.namespaces_refused["table_full"],
            namespaces_refused_rate_limited=s.namespaces_refused["rate_limited"],
            pool_address=self._pool_address(),
        )
