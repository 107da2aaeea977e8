"""Every far segment this worker holds, lent through its node's KV-store daemon: the
pool's ledger counts it (the daemon's `lent_bytes`, `attnstore_kvstore_lent_bytes
{borrower}`), the daemon's lending limits bound it, and it outlives a restart of this
worker (its home re-attaches it from the chunks).

    AppendKV piece ──> put as chunks lent to the home (ReservePut.borrower) ──> held
                       the daemon refuses (lending limits): RESOURCE_EXHAUSTED, the
                       segment dropped here (its home places it on another peer)
    AttachChunks ──> the home put the chunks itself (attach.py): only remembered
    either way ──> pinned in the daemon for a lease, renewed while the segment is held
    the segment released, or dropped idle (its home died) ──> its chunks deleted

Decisions:
- The chunks are the segment's own KV, not a bare count: the daemon counts lent bytes by
  the chunks it holds for a borrower (no other record exists), and the copy lets the home
  re-attach the segment after this worker restarts, as an attached one. Not durable (the
  append does not wait for the SSD's fsync: the copy that is attended is this worker's).
- Keys name the segment and position (a hash of both, keyed by a random salt of this
  worker process), not tokens: this worker never sees the tokens; a segment's id is unique
  among what it holds, and the salt keeps apart workers sharing a daemon and this worker's
  chunks from before a restart.
- Pinned while held: a lender at its limits that replaces borrowed chunks
  (pool_replace_borrowed, the default) skips pinned ones, so it refuses a new loan
  (NO_SPACE: RESOURCE_EXHAUSTED to the home, which places it on the next peer) instead of
  evicting the chunks of a segment that is attended; its own SSD eviction skips them too
  (bounded by its lending ceiling). A lease, not a plain pin: a worker killed without a
  restart stops renewing, and its chunks become replaceable within `lease_seconds`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable, Sequence

import grpc
import structlog
import torch

from attnstore.errors import InvalidArgument, ResourceExhausted, ServiceError, Unavailable
from attnstore.kvstore_client import AsyncKVStoreClient, DaemonProtocolError
from attnstore.kvstore_client.limits import MAX_KEYS_PER_REQUEST
from inference_worker.kv_codec import DTYPE_NAMES, encode_chunks

log = structlog.get_logger("dist_attention.lent_chunks")

_DAEMON_ERRORS = (grpc.RpcError, ServiceError, DaemonProtocolError, OSError)
_DAEMON_REFUSALS: dict[grpc.StatusCode, type[ServiceError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
}


def lent_namespace(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, chunk_tokens: int) -> bytes:
    """The namespace of appended segments' chunks of one layout (16 bytes)."""
    layout = f"attnstore-lent-kv {layers} {kv_heads} {head_dim} {DTYPE_NAMES[dtype]} {chunk_tokens}"
    return hashlib.blake2b(layout.encode(), digest_size=16).digest()


def lent_keys(salt: bytes, segment_id: str, start: int, stop: int, chunk_tokens: int) -> list[bytes]:
    """Keys of the chunks of positions [start, stop) of `segment_id` (a partial last one)."""
    return [
        hashlib.blake2b(f"{segment_id}\0{position}".encode(), digest_size=32, key=salt).digest()
        for position in range(start, stop, chunk_tokens)
    ]


class LentChunks:
    def __init__(self, kvstore: AsyncKVStoreClient | None, chunk_tokens: int, lease_seconds: int) -> None:
        """`kvstore`: this node's daemon (None: nothing is lent through a ledger);
        `lease_seconds`: how long a pin of the chunks lasts unless `renew` comes first."""
        self._kvstore = kvstore
        self._chunk_tokens = chunk_tokens
        self._lease_seconds = lease_seconds
        self._registered: set[bytes] = set()
        # Keys apart from another worker's sharing the daemon, and from its own before a restart.
        self._salt = os.urandom(16)
        self._chunks: dict[str, tuple[bytes, list[bytes]]] = {}  # segment id -> (namespace, keys)
        self._pool_daemon = ""

    async def pool_daemon(self) -> str:
        """The daemon's id in the pool's ledger (its Stats.pool_address; "": in none yet, or
        not answering): asked until known, then kept (fixed by its settings)."""
        if not self._pool_daemon and self._kvstore is not None:
            try:
                self._pool_daemon = (await self._kvstore.stats()).pool_address
            except _DAEMON_ERRORS as exc:
                log.info("lent_chunks_pool_daemon_unknown", error=str(exc))
        return self._pool_daemon

    async def put(
        self, segment_id: str, start: int, k: torch.Tensor, v: torch.Tensor, borrower: str
    ) -> tuple[bytes, list[bytes]]:
        """Puts K, V [layers, n, kv_heads, D] at positions [start, +n) of `segment_id` in
        the daemon as lent to `borrower`; their namespace and keys (empty: no daemon). Raises
        ResourceExhausted (past the daemon's lending limits, or its namespaces full),
        InvalidArgument (a layout it refuses), Unavailable (no answer)."""
        if self._kvstore is None:
            return b"", []
        layers, tokens, kv_heads, dim = k.shape
        namespace = lent_namespace(layers, kv_heads, dim, k.dtype, self._chunk_tokens)
        keys = lent_keys(self._salt, segment_id, start, start + tokens, self._chunk_tokens)
        kv = [(k[layer].transpose(0, 1), v[layer].transpose(0, 1)) for layer in range(layers)]
        # off the server's loop: an 8 MB piece's copy into chunks would hold up its other calls
        chunks = await asyncio.to_thread(
            encode_chunks, namespace, keys, kv, self._chunk_tokens, start, include_partial=True
        )
        try:
            if namespace not in self._registered:
                await self._kvstore.register_namespace(namespace, num_layers=layers, kv_heads=kv_heads, head_dim=dim,
                                                       chunk_tokens=self._chunk_tokens, dtype=DTYPE_NAMES[k.dtype])  # fmt: skip
                self._registered.add(namespace)
            put = await self._kvstore.put_chunks(namespace, list(zip(keys, chunks, strict=True)),
                                                 borrower=borrower)  # fmt: skip
        except grpc.RpcError as exc:
            self._registered.discard(
                namespace
            )  # the daemon may have restarted or forgotten it: again next time
            meant = _DAEMON_REFUSALS.get(exc.code(), Unavailable)  # a layout it refuses: the caller's KV
            raise meant(f"this worker's KV-store daemon did not take the lent KV: {exc.code().name} "
                        f"{exc.details()}") from exc  # fmt: skip
        except _DAEMON_ERRORS as exc:
            raise Unavailable(f"this worker's KV-store daemon did not take the lent KV: {exc}") from exc
        if put.no_space or put.in_progress:
            await self._delete(namespace, put.stored)
            raise ResourceExhausted(
                f"this node's KV-store daemon has no room for the lent KV: {len(put.no_space)} of {len(keys)} "
                f"chunks refused (past its lending limits, or no DRAM to stage them), {len(put.in_progress)} "
                "in progress"
            )
        await self.remember(segment_id, namespace, keys)
        return namespace, keys

    async def remember(self, segment_id: str, namespace: bytes, keys: list[bytes]) -> None:
        """Chunks of `segment_id` in the daemon: pinned while it is held here (`renew`),
        deleted once it is not."""
        _, known = self._chunks.setdefault(segment_id, (namespace, []))
        known.extend(keys)
        await self._pin(namespace, keys)

    async def renew(self) -> None:
        """Pins the chunks of every segment held here for another lease (the idle sweep
        calls it, within a quarter of the lease)."""
        for namespace, keys in list(self._chunks.values()):
            await self._pin(namespace, keys)

    async def delete_released(self, holds: Callable[[str], bool]) -> None:
        """Deletes the chunks of segments no longer held here (released, dropped idle: the
        home died, or refused), so the daemon stops counting them as lent."""
        for segment_id in [s for s in self._chunks if not holds(s)]:
            chunks = self._chunks.pop(segment_id, None)  # another call may have taken it meanwhile
            if chunks is not None:
                await self._delete(*chunks)

    async def _pin(self, namespace: bytes, keys: Sequence[bytes]) -> None:
        if self._kvstore is None:
            return
        try:
            for start in range(0, len(keys), MAX_KEYS_PER_REQUEST):
                batch = keys[start : start + MAX_KEYS_PER_REQUEST]
                pinned = await self._kvstore.pin(namespace, batch, ttl_seconds=self._lease_seconds)
                if pinned < len(batch):  # evicted before the pin, or lost: a restart recomputes
                    log.warning("lent_chunks_not_pinned", missing=len(batch) - pinned)
        except _DAEMON_ERRORS as exc:  # the worker's copy is the one attended: only the accounting suffers
            log.info("lent_chunks_not_pinned", error=str(exc))

    async def _delete(self, namespace: bytes, keys: list[bytes]) -> None:
        if not keys or self._kvstore is None:
            return
        try:
            await self._kvstore.delete(namespace, keys)
        except _DAEMON_ERRORS as exc:  # the daemon's eviction reclaims them (borrowed chunks first)
            log.info("lent_chunks_not_deleted", error=str(exc))
