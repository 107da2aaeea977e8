"""The daemon's data plane: chunk bytes over plain TCP (or TLS), beside gRPC.

Wire format: attnstore/data_plane_wire.py. Every connection is a protocol on the
daemon's own event loop (data_plane_connection.py), where the chunk store lives: a
request touches the store directly and its chunks go out in one gather write of arena
views. The first version ran a thread per connection that reached the store through
the loop (two hops a read, each a wake-up of another thread); on the shared 2-core
machine a 0.5 MB read cost the daemon about 300 us of CPU that way, against 86-186 us
for Redis GET (probe at load 13-16).

A connection that sends garbage, stalls past `data_plane_idle_timeout_seconds` or
disconnects mid-frame is closed; it holds nothing a lease's TTL would not end.
"""

from __future__ import annotations

import asyncio
import hmac
import socket
import ssl

import structlog

from attnstore.security import token_digest
from kvstore_daemon.chunk_store import ChunkStore
from kvstore_daemon.data_plane_connection import DataPlaneConnection
from kvstore_daemon.settings import DaemonSettings

log = structlog.get_logger("kvstore_daemon.data_plane")


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


class DataPlaneServer:
    def __init__(self, store: ChunkStore, settings: DaemonSettings) -> None:
        self.store = store
        self.settings = settings
        self._ssl = server_ssl_context(settings)
        auth = settings.internal_auth
        # Digests of the accepted hello tokens; None: no token asked (off, or mutual TLS).
        self.token_digests = (
            [*auth.token_sha256, *auth.admin_token_sha256] if auth.enabled and not settings.tls.require_client_cert else None
        )
        self.connections: set[DataPlaneConnection] = set()
        self._server: asyncio.AbstractServer | None = None

    @property
    def tls(self) -> bool:
        return self._ssl is not None

    async def start(self) -> int:
        """Binds and starts accepting; returns the bound port."""
        host = self.settings.listen_address.rsplit(":", 1)[0].strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, self.settings.data_plane_port))
        self._server = await asyncio.get_running_loop().create_server(
            lambda: DataPlaneConnection(self), sock=listener, backlog=128, ssl=self._ssl,
            ssl_handshake_timeout=self.settings.data_plane_idle_timeout_seconds if self._ssl else None,
        )  # fmt: skip
        return int(listener.getsockname()[1])

    def admit(self, connection: DataPlaneConnection) -> bool:
        """Whether another connection fits `data_plane_max_connections` (it is counted if so)."""
        if len(self.connections) >= self.settings.data_plane_max_connections:
            log.warning("data_plane_connection_refused", reason="data_plane_max_connections reached")
            return False
        self.connections.add(connection)
        return True

    def token_accepted(self, token: object) -> bool:
        if self.token_digests is None:
            return True
        digest = token_digest(token) if isinstance(token, str) else ""
        return any(hmac.compare_digest(digest, accepted) for accepted in self.token_digests)

    def stop(self) -> None:
        """Stops accepting and cuts every connection (in-flight sends end with them)."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.abort()
