"""The asyncio client of the KV-store daemon.

Chunk bytes move through the daemon's shared-memory arena when this process can map it
(same node), otherwise over the daemon's data plane (another node), otherwise over gRPC
streams (a daemon without a data plane, or one that cannot be reached); the choice is
made once, on first use, is invisible to callers, and `client_stats()` names it. Failures propagate (grpc.aio.AioRpcError, ChunkCorruptError,
...): callers such as the inference worker treat any of them as a cache miss.
"""

from __future__ import annotations

import contextlib
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TypedDict

from attnstore.chunks.format import ChunkLayout, verify_layer
from attnstore.closable import AsyncClosable
from attnstore.errors import InvalidArgument, ServiceError
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client import results, writes
from attnstore.kvstore_client.arena import ArenaHandle
from attnstore.kvstore_client.data_plane import DataPlane
from attnstore.kvstore_client.data_plane_choice import open_data_plane
from attnstore.kvstore_client.lease_releaser import LeaseReleaser
from attnstore.kvstore_client.location_cache import DEFAULT_ENTRIES as DEFAULT_LOCATION_ENTRIES
from attnstore.kvstore_client.location_cache import LocationCache
from attnstore.kvstore_client.pieces import (
    DaemonProtocolError,
    PutChunks,
    join_parts,
    normalize_put_items,
)
from attnstore.kvstore_client.pooled_reads import LOCAL, PlaceReader, merged_layers
from attnstore.kvstore_client.reads import (
    ChunkRead,
    open_checked_read,
    open_data_plane_read,
    open_grpc_read,
    open_shm_read,
    read_data_plane_into,
    read_data_plane_into_blocking,
)
from attnstore.security.credentials import ClientCredentials, aio_channel

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class ClientOptions(TypedDict, total=False):
    """AsyncKVStoreClient's keyword arguments (their defaults and meaning: its __init__),
    which the blocking KVStoreClient passes on."""

    use_shm: bool
    timeout_seconds: float
    verify_checksums: bool
    shm_dir: Path | None
    credentials: ClientCredentials | None
    location_cache_entries: int
    use_data_plane: bool
    data_plane_tls: ssl.SSLContext | None


class AsyncKVStoreClient(AsyncClosable):
    """One channel to one daemon. Create it inside a running event loop; `close()` it
    (or use `async with`) to end the channel and unmap the arena."""

    def __init__(
        self,
        address: str,
        *,
        use_shm: bool = True,
        timeout_seconds: float = 10.0,
        verify_checksums: bool = True,
        shm_dir: Path | None = None,
        credentials: ClientCredentials | None = None,
        location_cache_entries: int = DEFAULT_LOCATION_ENTRIES,
        use_data_plane: bool = True,
        data_plane_tls: ssl.SSLContext | None = None,
    ) -> None:
        """`timeout_seconds` bounds each call, a whole Get stream included.
        `verify_checksums` checks every layer read against its header checksum (xxh3; turn
        it off only to measure raw transfer speed). `shm_dir` is where this process sees the
        daemon's arena directory when it is mounted at another path than in the daemon.
        `credentials`: TLS (and the internal token) for a daemon that requires them; None:
        plaintext. Shared memory works the same under TLS: control goes over the channel.
        `location_cache_entries`: how many leased chunks' arena locations to remember, so
        reading them whole again takes no round trip (reads.py); 0 turns that off.
        `use_data_plane`: without shared memory, move bytes over the daemon's data plane when
        it has one (False: gRPC). `data_plane_tls`: the TLS context for it when the daemon's
        TLS is on (None: the system's trust roots); the token of `credentials` goes with it."""
        self.address = address
        # A peer of the pool is reached as this daemon is (peer_client).
        self._peer_options = {
            "use_shm": use_shm, "timeout_seconds": timeout_seconds, "verify_checksums": verify_checksums,
            "credentials": credentials, "location_cache_entries": location_cache_entries,
            "use_data_plane": use_data_plane, "data_plane_tls": data_plane_tls,
        }  # fmt: skip
        self._peers: dict[str, AsyncKVStoreClient] = {}
        self._timeout_seconds = timeout_seconds
        self._verify = verify_checksums
        self._channel = aio_channel(
            address,
            credentials,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = kvstore_pb2_grpc.KVStoreStub(self._channel)
        self._arena = ArenaHandle(
            self._stub, enabled=use_shm, shm_dir=shm_dir, timeout_seconds=timeout_seconds
        )
        self._releaser = LeaseReleaser(self._stub, timeout_seconds)
        self._locations = LocationCache(location_cache_entries)
        self._credentials = credentials
        self._use_data_plane = use_data_plane
        self._data_plane_tls = data_plane_tls
        self._transport: str | None = None  # "shm", "dataplane" or "grpc", chosen on first use
        self._plane: DataPlane | None = None
        self._transfers: dict[str, Counter[str]] = {"reads": Counter(), "writes": Counter()}

    async def close(self) -> None:
        for peer in self._peers.values():
            await peer.close()
        await self._releaser.close()
        self._arena.close()
        if self._plane is not None:
            self._plane.close()
        await self._channel.close()

    async def open_shm(self) -> bool:
        """Maps the daemon's arena if this process can; False means transfers use gRPC."""
        return await self._arena.available()

    async def transport(self) -> str:
        """The byte path, chosen once: "shm" (same node), "dataplane", or "grpc"."""
        if self._transport is None:
            if await self._arena.available():
                self._transport = "shm"
            else:
                if self._use_data_plane:
                    self._plane = await open_data_plane(
                        self._stub,
                        self.address,
                        self._credentials,
                        self._data_plane_tls,
                        self._timeout_seconds,
                    )
                self._transport = "grpc" if self._plane is None else self._plane.name
        return self._transport

    def client_stats(self) -> results.ClientStats:
        """The byte path in use (None before the first transfer), transfers per path, and
        the byte path to each pool peer read from."""
        return results.ClientStats(
            transport=self._transport, reads=dict(self._transfers["reads"]), writes=dict(self._transfers["writes"]),
            peers={address: peer.client_stats().transport for address, peer in self._peers.items()},
        )  # fmt: skip

    def peer_client(self, address: str) -> AsyncKVStoreClient:
        """The client of pool peer `address` (a gRPC address from Lookup), made once with
        this client's options: shared memory if the peer is on this node, else its data plane."""
        if address not in self._peers:
            self._peers[address] = AsyncKVStoreClient(address, **self._peer_options)  # type: ignore[arg-type]
        return self._peers[address]

    # Control calls

    async def register_namespace(
        self,
        namespace: bytes,
        *,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        chunk_tokens: int,
        dtype: str,
        model_label: str = "",
    ) -> int:
        """Declares a namespace's layout (idempotent); returns its max chunk size in bytes."""
        layout = kvstore_pb2.NamespaceLayout(
            num_layers=num_layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            chunk_tokens=chunk_tokens,
            dtype=dtype,
            model_label=model_label,
        )
        request = kvstore_pb2.RegisterNamespaceRequest(namespace=namespace, layout=layout)
        reply = await self._stub.RegisterNamespace(request, timeout=self._timeout_seconds)
        return reply.max_chunk_bytes

    async def lookup(
        self, namespace: bytes, keys: Sequence[bytes], *, promote: bool = False
    ) -> results.LookupResult:
        """The longest stored prefix of a key chain and the tier of each hit."""
        request = kvstore_pb2.LookupRequest(namespace=namespace, keys=keys, promote=promote)
        reply = await self._stub.Lookup(request, timeout=self._timeout_seconds)
        peers = list(reply.peer_addresses) or [""] * reply.prefix_length  # a daemon from before the pool
        return results.LookupResult(
            prefix_length=reply.prefix_length, tiers=[results.Tier(tier) for tier in reply.tiers], peers=peers
        )

    async def delete(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        # This client's finished leases end first: the daemon keeps a deleted chunk that is
        # still leased, and a put of its key right after (a corrupt chunk replaced) would find
        # it in progress and store nothing (a race once seen in test_turn_reuse under load).
        await self._releaser.settle()
        request = kvstore_pb2.DeleteRequest(namespace=namespace, keys=keys)
        return (await self._stub.Delete(request, timeout=self._timeout_seconds)).deleted_count

    async def pin(self, namespace: bytes, keys: Sequence[bytes], ttl_seconds: int = 0) -> int:
        request = kvstore_pb2.PinRequest(namespace=namespace, keys=keys, ttl_seconds=ttl_seconds)
        return (await self._stub.Pin(request, timeout=self._timeout_seconds)).pinned_count

    async def unpin(self, namespace: bytes, keys: Sequence[bytes]) -> int:
        request = kvstore_pb2.UnpinRequest(namespace=namespace, keys=keys)
        return (await self._stub.Unpin(request, timeout=self._timeout_seconds)).unpinned_count

    async def hint(
        self,
        namespace: bytes,
        entries: Sequence[
            tuple[Sequence[bytes], results.HintAction, int]
            | tuple[Sequence[bytes], results.HintAction, int, float]
        ],
        *,
        replace: bool = False,
        ttl_seconds: int = 0,
        source: str = "",
    ) -> results.HintResult:
        """Hints: (keys, action, queue position; 0 runs next[, seconds to the predicted
        use]) per entry. `replace` forgets only `source`'s earlier hints of the namespace."""
        request = kvstore_pb2.HintRequest(
            namespace=namespace,
            entries=[
                kvstore_pb2.HintEntry(
                    keys=entry[0],
                    action=entry[1].value,
                    queue_position=entry[2],
                    next_use_seconds=entry[3] if len(entry) > 3 else 0.0,
                )
                for entry in entries
            ],
            replace=replace,
            ttl_seconds=ttl_seconds,
            source=source,
        )
        reply = await self._stub.Hint(request, timeout=self._timeout_seconds)
        return results.HintResult(hinted_keys=reply.hinted_keys, prefetches_started=reply.prefetches_started)

    async def stats(self) -> kvstore_pb2.StatsResponse:
        return await self._stub.Stats(kvstore_pb2.StatsRequest(), timeout=self._timeout_seconds)

    # Writes

    async def put_chunks(
        self,
        namespace: bytes,
        chunks: PutChunks,
        *,
        durable: bool = False,
        ttl_seconds: int = 0,
        borrower: str = "",
    ) -> results.PutResult:
        """Stores serialized chunks (a mapping or (key, bytes) pairs; a repeated key counts
        once): reserve, write, commit. `durable` waits for the SSD fsync; `ttl_seconds`
        bounds the reservation; `borrower` (a pool daemon placing its evictions: its node)
        makes the daemon count them as lent. On any failure the reservations are aborted
        and it raises."""
        transport = await self.transport()
        self._transfers["writes"][transport] += 1
        return await writes.put_chunks(
            self._stub,
            self._arena,
            self._plane,
            namespace,
            normalize_put_items(chunks),
            durable=durable,
            ttl_seconds=ttl_seconds,
            timeout_seconds=self._timeout_seconds,
            borrower=borrower,
        )

    # Reads

    @contextlib.asynccontextmanager
    async def _open_read(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int
    ) -> AsyncIterator[ChunkRead]:
        """The one read path per transport: shared memory when mapped, else the data plane,
        else the Get stream."""
        transport = await self.transport()
        self._transfers["reads"][transport] += 1
        if transport == "shm":
            opened = open_shm_read(
                self._stub,
                self._arena,
                namespace,
                keys,
                layer_start,
                layer_end,
                self._timeout_seconds,
                self._releaser,
                self._locations,
            )
        elif self._plane is not None:
            opened = open_data_plane_read(self._plane, namespace, keys, layer_start, layer_end)
        else:
            opened = open_grpc_read(
                self._stub, namespace, keys, layer_start, layer_end, self._timeout_seconds
            )
        async with opened as read:
            yield read

    async def get_chunks(
        self, namespace: bytes, keys: Sequence[bytes], *, layer_start: int = 0, layer_end: int = 0
    ) -> list[results.ChunkData]:
        """Layers [layer_start, layer_end) of each chunk (`layer_end` 0 = all), with its layout."""
        found: dict[int, results.ChunkData] = {}  # by index: a read that is retried allocates again

        def allocate(index: int, layout: ChunkLayout, span_bytes: int) -> memoryview:
            found[index] = results.ChunkData(layout=layout, data=bytearray(span_bytes))
            return memoryview(found[index].data)

        await self._read_into(namespace, keys, layer_start, layer_end, allocate, whole=False)
        return [found[index] for index in range(len(keys))]

    async def get_chunks_into(
        self, namespace: bytes, keys: Sequence[bytes], outs: Sequence[memoryview]
    ) -> list[ChunkLayout]:
        """Copies each whole serialized chunk into the front of `outs[i]` (which must hold
        at least `layout.total_bytes`); no other allocation, for benchmarks and pools."""
        return await self._read_into(namespace, keys, 0, 0, _fronts_of(outs, keys), whole=True)

    def get_chunks_into_blocking(
        self, namespace: bytes, keys: Sequence[bytes], outs: Sequence[memoryview]
    ) -> list[ChunkLayout] | None:
        """`get_chunks_into` in the calling thread, when this client reads over the data plane
        (known after its first call): the blocking client's path, with no hop to the event
        loop and back. None otherwise: call `get_chunks_into`."""
        if self._transport != "dataplane" or self._plane is None or not keys:
            return None
        destination = _fronts_of(outs, keys)
        self._transfers["reads"]["dataplane"] += 1
        read, copies = read_data_plane_into_blocking(
            self._plane, namespace, keys, 0, 0, lambda read: self._outs(read, destination, True)
        )
        self._check_copies(read, copies)
        return read.layouts

    async def get_whole_chunks(self, namespace: bytes, keys: Sequence[bytes]) -> list[bytes]:
        """Each full serialized chunk (header and every layer), byte-identical to what was put."""
        buffers: dict[int, bytearray] = {}

        def allocate(index: int, layout: ChunkLayout, span_bytes: int) -> memoryview:
            buffers[index] = bytearray(span_bytes)
            return memoryview(buffers[index])

        await self._read_into(namespace, keys, 0, 0, allocate, whole=True)
        return [bytes(buffers[index]) for index in range(len(keys))]

    async def _read_into(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        layer_start: int,
        layer_end: int,
        destination: Callable[[int, ChunkLayout, int], memoryview],
        *,
        whole: bool,
    ) -> list[ChunkLayout]:
        """Copies a layer range of each chunk into `destination(index, layout, bytes)`, called
        once per chunk in order: the whole serialized chunk if `whole`, else only the layers.
        Chunks leased before are first copied without a lease or a round trip; if any of
        them moved meanwhile, the copy is discarded and the read leases as usual (so
        `destination` may be called twice for an index)."""
        if not keys:
            return []
        checked = open_checked_read(self._arena, self._locations, namespace, keys, layer_start, layer_end)
        if checked is not None:
            with contextlib.suppress(ValueError, ServiceError, DaemonProtocolError):  # moved mid-copy
                copies = await self._copy_out(checked, destination, whole)
                if checked.still_valid():
                    self._transfers["reads"]["shm"] += 1
                    self._check_copies(checked, copies)
                    self._releaser.note_reads(namespace, keys)
                    return checked.layouts
            self._locations.forget(namespace, keys)
        if await self.transport() == "dataplane" and self._plane is not None:
            self._transfers["reads"]["dataplane"] += 1
            read, copies = await read_data_plane_into(
                self._plane,
                namespace,
                keys,
                layer_start,
                layer_end,
                lambda read: self._outs(read, destination, whole),
            )
            self._check_copies(read, copies)
            return read.layouts
        async with self._open_read(namespace, keys, layer_start, layer_end) as read:
            copies = await self._copy_out(read, destination, whole)
            self._check_copies(read, copies)
            return read.layouts

    @classmethod
    async def _copy_out(
        cls, read: ChunkRead, destination: Callable[[int, ChunkLayout, int], memoryview], whole: bool
    ) -> list[tuple[memoryview, int]]:
        """Each chunk's output buffer and the chunk offset of its first byte, filled."""
        copies = cls._outs(read, destination, whole)
        await read.copy_into([out for out, _ in copies], [base for _, base in copies])
        return copies

    @staticmethod
    def _outs(
        read: ChunkRead, destination: Callable[[int, ChunkLayout, int], memoryview], whole: bool
    ) -> list[tuple[memoryview, int]]:
        """Each chunk's output buffer (its header region filled when `whole`) and the chunk
        offset of its first byte."""
        copies: list[tuple[memoryview, int]] = []
        for index, layout in enumerate(read.layouts):
            first, last = layout.layer_span(read.layer_start, read.layer_end)
            if whole:
                first, last = 0, layout.total_bytes
            out = destination(index, layout, last - first)
            if whole:
                out[: layout.data_offset] = read.header_region(index)
            copies.append((out, first))
        return copies

    def _check_copies(self, read: ChunkRead, copies: Sequence[tuple[memoryview, int]]) -> None:
        if not self._verify:
            return
        for (out, base), layout in zip(copies, read.layouts, strict=True):
            for layer in range(read.layer_start, read.layer_end):
                start, end = layout.layer_span(layer, layer + 1)
                verify_layer(layout, layer, out[start - base : end - base])

    async def iter_layers(
        self,
        namespace: bytes,
        keys: Sequence[bytes],
        *,
        layer_start: int = 0,
        layer_end: int = 0,
        places: Sequence[str] = (),
    ) -> AsyncIterator[results.LayerPiece]:
        """Each requested layer of each chunk as it arrives, layer-major, for layer-wise
        loading. Over shared memory one lease covers the whole iteration: close the
        iterator (`contextlib.aclosing`) when stopping early so the lease ends at once.
        A layer that lies in one arena extent comes as a read-only view of the leased
        arena, valid until the iteration ends: a consumer that copies it anyway (into
        tensors) then makes the only copy, and can verify the bytes right after copying,
        while they are in cache (`verify_layer`), instead of having this client read them
        from DRAM once more to verify them first.
        `places` (LookupResult.peers): where each key lies, "" for this daemon or a pool
        peer's address; chunks on peers are then read from the peers themselves (their
        data plane across nodes), merged into the same layer-major order (pooled_reads.py),
        instead of through this daemon, which would copy them in first."""
        if not any(places):
            async with contextlib.aclosing(
                self._iter_here(namespace, keys, layer_start, layer_end)
            ) as pieces:
                async for piece in pieces:
                    yield piece
            return
        if len(places) != len(keys):
            raise InvalidArgument(f"{len(places)} places for {len(keys)} keys")

        def reader_of(place: str) -> PlaceReader:
            if place == LOCAL:
                return lambda some, start, end: self._iter_here(namespace, some, start, end)
            self._transfers["reads"]["peer"] += 1
            peer = self.peer_client(place)
            return lambda some, start, end: peer._iter_here(namespace, some, start, end)

        async with contextlib.aclosing(
            merged_layers(keys, places, reader_of, layer_start, layer_end)
        ) as pieces:
            async for piece in pieces:
                yield piece

    async def _iter_here(
        self, namespace: bytes, keys: Sequence[bytes], layer_start: int, layer_end: int
    ) -> AsyncIterator[results.LayerPiece]:
        """iter_layers of chunks this daemon holds."""
        if not keys:
            return
        async with (
            self._open_read(namespace, keys, layer_start, layer_end) as read,
            contextlib.aclosing(read.layers()) as layers,
        ):
            async for index, layer, parts in layers:
                single_view = len(parts) == 1 and isinstance(parts[0], memoryview)
                data = parts[0].toreadonly() if single_view else join_parts(parts)
                if self._verify:
                    verify_layer(read.layouts[index], layer, data)
                yield results.LayerPiece(
                    chunk_index=index, layer=layer, data=data, layout=read.layouts[index]
                )


def _fronts_of(
    outs: Sequence[memoryview], keys: Sequence[bytes]
) -> Callable[[int, ChunkLayout, int], memoryview]:
    """get_chunks_into's destination: the front of `outs[index]`, refused when too small."""
    if len(outs) != len(keys):
        raise InvalidArgument(f"{len(outs)} output buffers for {len(keys)} keys")

    def front(index: int, layout: ChunkLayout, span_bytes: int) -> memoryview:
        out = memoryview(outs[index]).cast("B")
        if out.nbytes < span_bytes:
            raise InvalidArgument(f"output buffer {index} holds {out.nbytes} bytes, chunk has {span_bytes}")
        return out[:span_bytes]

    return front
