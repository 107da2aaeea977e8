"""Loaded credentials: what a server binds with and what a client dials with. PEM and
token files are read once, when a service starts, so a missing or unreadable file stops
it with the file and the setting named."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from attnstore.security.bearer_token import bearer_token_interceptors

ChannelOptions = Sequence[tuple[str, Any]]
# gRPC's default reconnect backoff grows to 120 s while a peer is down, and calls fail fast
# until the next attempt: a restarted daemon or worker would stay unreachable for minutes.
# Capped at 1 s, a client reaches it again within a second of its return. Not
# `grpc.min_reconnect_backoff_ms`: despite its name gRPC reads it as the minimum connect
# timeout (default 20 s), and at 100 ms a busy peer that took longer than that to send its
# HTTP/2 SETTINGS failed a first call with UNAVAILABLE ("timed out before receiving
# SETTINGS frame": 3 of 15 pool test runs at load 12).
RECONNECT_OPTIONS: ChannelOptions = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class SecurityConfigError(Exception):
    """A certificate, key or token file cannot be used; the message names it."""


def read_secret_file(path: Path, setting: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from exc
    if not data.strip():
        raise SecurityConfigError(f"{setting}: {path} is empty")
    return data


@dataclass(frozen=True)
class ClientCredentials:
    """What a client needs to dial a TLS server: grpc channel credentials (trust roots, and
    optionally its own certificate), the name the server's certificate must carry when it
    is not the host of the address, and an internal token to send on every call."""

    channel_credentials: grpc.ChannelCredentials
    server_name: str | None = None
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_pem(
        cls,
        root_certificates: bytes | None = None,
        *,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
        server_name: str | None = None,
        token: str | None = None,
    ) -> ClientCredentials:
        """`root_certificates` None: the system's trust roots. `certificate_chain` and
        `private_key`: this client's certificate, for servers that require one (mutual
        TLS). `token`: sent as `authorization: Bearer <token>` on every call."""
        credentials = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
        return cls(credentials, server_name, token)

    def options(self) -> list[tuple[str, Any]]:
        return [] if self.server_name is None else [("grpc.ssl_target_name_override", self.server_name)]


def aio_channel(
    address: str, credentials: ClientCredentials | None, options: ChannelOptions = ()
) -> grpc.aio.Channel:
    """A TLS channel with `credentials`, a plaintext one without."""
    options = [*RECONNECT_OPTIONS, *options]
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    token = credentials.token
    return grpc.aio.secure_channel(
        address,
        credentials.channel_credentials,
        options=[*options, *credentials.options()],
        interceptors=bearer_token_interceptors(token) if token is not None else None,
    )


def sync_channel(
    address: str, credentials: ClientCredentials | None, options: ChannelOptions = ()
) -> grpc.Channel:
    """The blocking twin of aio_channel (its token goes as grpc call credentials: blocking
    callers are not on a hot path)."""
    options = [*RECONNECT_OPTIONS, *options]
    if credentials is None:
        return grpc.insecure_channel(address, options=options)
    channel_credentials = credentials.channel_credentials
    if credentials.token is not None:
        channel_credentials = grpc.composite_channel_credentials(
            channel_credentials, grpc.access_token_call_credentials(credentials.token)
        )
    return grpc.secure_channel(address, channel_credentials, options=[*options, *credentials.options()])
