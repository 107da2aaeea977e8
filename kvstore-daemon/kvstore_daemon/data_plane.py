"""The daemon's data plane: chunk bytes over plain TCP (or TLS), beside gRPC.

Wire format: attnstore/data_plane_wire.py. One thread per connection with blocking
sockets: a send of megabytes is one `sendmsg` of arena views (or `sendall`s under TLS)
that runs without the GIL, and nothing is copied into an event loop's buffers. The
chunk store lives on the event loop; a thread touches it only through `_on_loop`, and
sends only from chunks it holds a reader on (`ChunkStore.hold_leased`), so neither the
lease's expiry nor an eviction can move the bytes under a send.

Writes are received into a per-connection buffer and copied into the reservation on the
loop (one copy): a reservation that expires or is aborted meanwhile frees its blocks at
once, so a thread must never write into them directly.

A connection that sends garbage, stalls past `data_plane_idle_timeout_seconds` or
disconnects mid-frame is closed; it holds nothing a lease's TTL would not end.

On plain TCP, a connection's frames go first to the C read path (data_plane_reads.py):
unheld reads of DRAM chunks in its table (entered when committed or promoted to DRAM, or
when this file sent them) are answered there without Python; the first frame it cannot
answer comes back here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hmac
import os
import socket
import ssl
import threading
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import structlog

from attnstore import errors
from attnstore.data_plane_wire import (
    FrameError,
    error_frame,
    field,
    pack_frame,
    recv_exactly_into,
    recv_frame,
    send_frame,
    send_views,
)
from attnstore.security import token_digest
from kvstore_daemon import metrics
from kvstore_daemon.chunk_entry import Chunk
from kvstore_daemon.chunk_store import ChunkStore, UnheldCopy
from kvstore_daemon.data_plane_reads import CReads, open_c_reads
from kvstore_daemon.settings import DaemonSettings
from kvstore_daemon.validation import check_keys, check_layer_range, check_namespace

log = structlog.get_logger("kvstore_daemon.data_plane")
# Hits and recency of unheld reads are noted in a batch this long after the first: a drain
# wakes the loop on a cold cache (~175 us of its CPU a drain for one or two 5.9 MB reads,
# load 12-16), so at 5 ms a lone large reader paid ~215 us of the loop's CPU a read; at
# 50 ms ~45 (lower in 8 of 8 A/B rounds, 2 cores).
_READS_NOTED_EVERY_SECONDS = 0.05
T = TypeVar("T")


def server_ssl_context(settings: DaemonSettings) -> ssl.SSLContext | None:
    """The data plane's TLS, from the gRPC server's files; None when TLS is off."""
    tls = settings.tls
    if tls.cert_file is None or tls.key_file is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.require_client_cert and tls.client_ca_file is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(tls.client_ca_file)
    return context


def granted_send_buffer(asked: int, wmem_max: int, autotune_max: int) -> int | None:
    """The SO_SNDBUF to ask for on a connection, or None to leave the kernel's autotuning:
    Linux grants twice the ask up to twice `wmem_max` and stops autotuning, so an ask is
    worth it only where that beats autotuning's cap (`autotune_max`, tcp_wmem's third
    value). A whole 5.9 MB chunk in one sendmsg instead of waiting for room: the daemon's
    thread 3.2-3.8 -> 2.6-3.1 context switches a read, one reader 22 of 32 rounds faster,
    medians +2-15% (A/A control 3 of 8, load 7, 2 cores)."""
    granted = 2 * min(asked, wmem_max)
    return granted // 2 if asked and granted > autotune_max else None


def _kernel_send_buffer_limits() -> tuple[int, int]:
    """(net.core.wmem_max, tcp_wmem's max); zeros where /proc does not say (no ask then)."""
    try:
        wmem_max = int(Path("/proc/sys/net/core/wmem_max").read_text())
        autotune_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return 0, 0
    return wmem_max, autotune_max


class DataPlaneServer:
    def __init__(self, store: ChunkStore, settings: DaemonSettings, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._settings = settings
        self._loop = loop
        self._ssl = server_ssl_context(settings)
        auth = settings.internal_auth
        self._tokens = (
            [*auth.token_sha256, *auth.admin_token_sha256]
            if auth.enabled and not settings.tls.require_client_cert
            else None
        )
        self._send_buffer = granted_send_buffer(
            settings.data_plane_send_buffer_bytes, *_kernel_send_buffer_limits()
        )
        self._slots = threading.BoundedSemaphore(settings.data_plane_max_connections)
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._reads: list[tuple[bytes, list[bytes]]] = []  # unheld reads the loop has yet to note
        self._reads_lock = threading.Lock()
        self._c: CReads | None = None  # opened by start(): a daemon without a data plane builds nothing

    @property
    def tls(self) -> bool:
        return self._ssl is not None

    def start(self) -> int:
        """Binds and starts accepting; returns the bound port."""
        host = self._settings.listen_address.rsplit(":", 1)[0].strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, self._settings.data_plane_port))
        listener.listen(128)
        self._listener = listener
        settings = self._settings
        if settings.data_plane_c_reads and self._ssl is None:
            self._c, why_not = open_c_reads(
                self._store.dram, settings.data_plane_c_read_entries, settings.max_keys_per_request,
                settings.data_plane_max_frame_bytes,
            )  # fmt: skip
            log.info("data_plane_c_reads", on=self._c is not None, reason=why_not)
        if self._c is not None:  # reads served in C are noted as the Python path's are
            self._loop.add_reader(self._c.wake_fd, self._on_c_reads)
            self._store.dram.watch(_CTable(self._c, self._store))
        threading.Thread(target=self._accept_forever, name="data-plane-accept", daemon=True).start()
        return listener.getsockname()[1]

    def stop(self) -> None:
        """Stops accepting and cuts every connection (in-flight sends end with them); after
        it no thread reads the arena."""
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            for conn in self._connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed by its thread
                    pass
        if self._c is not None:
            self._loop.remove_reader(self._c.wake_fd)
            self._c.close()

    def _accept_forever(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed by stop()
                return
            if not self._slots.acquire(blocking=False):
                log.warning("data_plane_connection_refused", reason="data_plane_max_connections reached")
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="data-plane-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(self._settings.data_plane_idle_timeout_seconds)  # bounds a stalled peer
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._send_buffer is not None:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
        with self._lock:
            self._connections.add(conn)
        sock = conn
        try:
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(conn, server_side=True)
            self._hello(sock)
            buffer = bytearray()
            while True:
                request = self._next_request(sock)
                op = field(request, "op", str)
                if op == "get":
                    self._get(sock, request)
                elif op == "put":
                    buffer = self._put(sock, request, buffer)
                else:
                    raise FrameError(f"unknown op {op!r}")
        except errors.ServiceError as exc:
            if not isinstance(exc, errors.Unavailable):  # a closed peer hears nothing
                self._try_send(sock, error_frame(exc))
        except (
            OSError,
            ssl.SSLError,
        ):  # a reset, a timeout (TimeoutError too), a failed handshake: just close
            pass
        finally:
            with self._lock:
                self._connections.discard(conn)
            sock.close()
            self._slots.release()

    def _next_request(self, sock: socket.socket) -> dict[str, Any]:
        """The next request Python answers: on plain TCP, after the C path answered the
        reads it could."""
        if self._c is None:
            return recv_frame(sock, self._settings.data_plane_max_frame_bytes)
        return self._c.serve_frames(sock, self._settings.data_plane_idle_timeout_seconds)

    @staticmethod
    def _try_send(sock: socket.socket, message: dict[str, Any]) -> None:
        try:
            send_frame(sock, message)
        except OSError:
            pass

    def _hello(self, sock: socket.socket) -> None:
        hello = recv_frame(sock, self._settings.data_plane_max_frame_bytes)
        if hello.get("op") != "hello":
            raise FrameError("the first frame must be a hello")
        if self._tokens is not None:
            token = hello.get("token")
            digest = token_digest(token) if isinstance(token, str) else ""
            if not any(hmac.compare_digest(digest, accepted) for accepted in self._tokens):
                raise errors.Unauthenticated("the data plane needs a valid internal token")
        send_frame(sock, {"ok": True})

    def _get(self, sock: socket.socket, request: dict[str, Any]) -> None:
        """Sends chunks named by `keys` (held for the send, as gRPC's Get does: one round
        trip; or, when the reader accepts it, `unheld`), or chunks `chunks` of a lease
        granted by GetShm (ended after with `release`)."""
        namespace = check_namespace(field(request, "namespace", bytes))
        limit = self._settings.max_keys_per_request
        release_id = None
        if "keys" in request:
            keys = field(request, "keys", list)
            if not 0 < len(keys) <= limit or not all(isinstance(key, bytes) for key in keys):
                raise FrameError(f"keys must list 1..{limit} keys (bytes)")
            keys = check_keys(keys, limit, unique=True)
            if "unheld" in request and field(request, "unheld", bool):
                copies = self._store.unheld_copies(namespace, keys)
                if copies is not None and self._send_unheld(sock, request, namespace, keys, copies):
                    return
            chunks = self._await_on_loop(self._store.hold_keys(namespace, keys))
        else:
            lease_id = field(request, "lease", int)
            indices = field(request, "chunks", list)
            if not 0 < len(indices) <= limit or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in indices
            ):
                raise FrameError(f"chunks must list 1..{limit} chunk indices")
            release_id = lease_id if request.get("release") is True else None
            chunks = self._on_loop(self._store.hold_leased, namespace, lease_id, indices)
        try:
            self._send(sock, request, chunks, {})
        finally:  # no need to wait: nothing here depends on it
            self._loop.call_soon_threadsafe(self._store.unhold, chunks, release_id)

    def _send_unheld(
        self, sock: socket.socket, request: dict[str, Any], namespace: bytes, keys: list[bytes],
        copies: list[UnheldCopy],
    ) -> bool:  # fmt: skip
        """Sends DRAM chunks without a hop to the event loop to hold them (on a busy 2-core
        node that hop, a wake-up of the loop and one of this thread, was 150 of the 490 us
        of a 0.5 MB read). A seqlock read: the headers are checked before the reply (False:
        a chunk moved, hold it instead), the payload after it, and a trailer frame tells
        the reader whether to keep it (`valid`) or ask again with the chunks held."""
        headers = [self._store.header_bytes(copy) for copy in copies]
        if not self._store.unheld_copies_valid(copies):
            return False
        self._send(sock, request, copies, {"headers": headers, "trailer": True})
        valid = self._store.unheld_copies_valid(copies)
        send_frame(sock, {"ok": True, "valid": valid})
        if valid:  # hits and recency as a held read's, without waiting for the loop
            self._note_read(namespace, keys)
            if self._c is not None:  # later reads of these chunks are answered in C
                for key, copy in zip(keys, copies, strict=True):
                    self._c.register(namespace, key, copy)
        return True

    def _note_read(self, namespace: bytes, keys: list[bytes]) -> None:
        """Queues an unheld read's hits and recency for the loop, which takes them every
        `_READS_NOTED_EVERY_SECONDS`: waking the loop for each read took 50-70 us of a
        0.5 MB Get's 240-310 (its thread and this one then share the GIL and 2 busy cores)."""
        with self._reads_lock:
            self._reads.append((namespace, keys))
            if len(self._reads) > 1:  # a drain is already scheduled
                return
        self._loop.call_soon_threadsafe(self._loop.call_later, _READS_NOTED_EVERY_SECONDS, self._drain_reads)

    def _on_c_reads(self) -> None:
        """The C path served reads since the last drain (its eventfd, written once a drain)."""
        assert self._c is not None
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._c.wake_fd)
        self._loop.call_later(_READS_NOTED_EVERY_SECONDS, self._drain_reads)

    def _drain_reads(self) -> None:
        with self._reads_lock:
            reads, self._reads = self._reads, []
        if self._c is not None:
            served = self._c.take_reads()
            reads.extend(served.valid.items())
            metrics.BYTES_OUT.labels("dataplane").inc(served.bytes_sent)
            metrics.DATA_PLANE_C_READS.inc(served.chunks_sent)
            if served.not_recorded:
                log.warning(
                    "data_plane_reads_not_noted",
                    reads=served.not_recorded,
                    reason="the C record buffer was full",
                )
        for namespace, keys in reads:
            with contextlib.suppress(errors.ServiceError):  # its namespace was dropped meanwhile
                self._store.note_lease_free_reads(namespace, keys, None)

    def _send(
        self, sock: socket.socket, request: dict[str, Any], chunks: Sequence[Chunk | UnheldCopy],
        reply: dict[str, Any],
    ) -> None:  # fmt: skip
        """The reply (`reply`, headers read from `chunks` unless given) and the requested
        layers of `chunks`, layer-major, so the reader may start on layer 0; one gather
        write for the reply and every view (a sendmsg per layer cost 30 syscalls per chunk)."""
        layout = chunks[0].layout
        assert layout is not None  # held and unheld chunks are parsed
        num_layers = layout.header.num_layers  # one namespace: one layer count
        start, end = check_layer_range(
            field(request, "layer_start", int), field(request, "layer_end", int), num_layers
        )
        headers = reply.get("headers") or [self._store.header_bytes(chunk) for chunk in chunks]
        frame = pack_frame({**reply, "ok": True, "headers": headers})
        views = (  # one chunk's layer range is contiguous: its blocks' views, not 30 layers'
            self._store.layer_views(chunks[0], start, end)
            if len(chunks) == 1
            else [
                view
                for layer in range(start, end)
                for chunk in chunks
                for view in self._store.layer_views(chunk, layer, layer + 1)
            ]
        )
        send_views(sock, [memoryview(frame), *views])
        metrics.BYTES_OUT.labels("dataplane").inc(sum(v.nbytes for v in views))

    def _put(self, sock: socket.socket, request: dict[str, Any], buffer: bytearray) -> bytearray:
        namespace = check_namespace(field(request, "namespace", bytes))
        writes = _write_list(field(request, "writes", list), self._settings.max_keys_per_request)
        self._on_loop(self._store.check_streamed_writes, namespace, writes)
        written = 0
        for write_id, size in writes:
            if len(buffer) < size:
                buffer = bytearray(size)
            view = memoryview(buffer)[:size]
            recv_exactly_into(sock, view)
            self._on_loop(self._store.write, write_id, 0, view)
            written += size
        metrics.BYTES_IN.labels("dataplane").inc(written)
        send_frame(sock, {"ok": True, "bytes_written": written})
        return buffer

    def _await_on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout=self._settings.data_plane_idle_timeout_seconds)

    def _on_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Runs `fn(*args)` on the store's event loop and returns its result (or raises)."""
        result: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            try:
                result.set_result(fn(*args))
            except Exception as exc:  # noqa: BLE001 -- handed to the waiting thread, which raises it
                result.set_exception(exc)

        self._loop.call_soon_threadsafe(call)
        return result.result(timeout=self._settings.data_plane_idle_timeout_seconds)


class _CTable:
    """Keeps C's read table in step with DRAM: a chunk enters when committed or promoted
    there (so its first read is answered in C), and leaves before its blocks are freed."""

    def __init__(self, c: CReads, store: ChunkStore) -> None:
        self._c = c
        self._store = store

    def arrived(self, chunk: Chunk) -> None:
        copy = self._store.unheld_copy(chunk)
        if copy is not None:  # a chunk promoted before it was ever parsed enters at its first send
            self._c.register(chunk.namespace, chunk.key, copy)

    def leaving(self, chunk: Chunk) -> None:
        if chunk.blocks:
            self._c.forget(chunk.namespace, chunk.key, chunk.blocks[0])


def _write_list(raw: Sequence[Any], max_writes: int) -> list[tuple[int, int]]:
    if not 0 < len(raw) <= max_writes:
        raise FrameError(f"writes must list 1..{max_writes} [write_id, bytes] pairs")
    writes = []
    for item in raw:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in item)
        ):
            raise FrameError("each write must be [write_id, bytes], positive integers")
        writes.append((item[0], item[1]))
    if len({write_id for write_id, _ in writes}) != len(writes):
        raise FrameError("a write id is named twice")
    return writes
