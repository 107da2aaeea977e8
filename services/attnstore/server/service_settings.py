"""The settings every gRPC service of attnstore has: where it serves, how it reports,
how it stops. Each service adds its own and names its own address and grace period."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from attnstore.security import InternalAuth, ServerTLS
from attnstore.server.concurrency import ServingLimits
from attnstore.settings import FileBackedSettings

# Each service gives its own default: `listen_address: ListenAddress = f"127.0.0.1:{DAEMON_PORT}"`
# (attnstore.server.ports).
ListenAddress = Annotated[str, Field(description="host:port of the gRPC server; port 0 picks one")]
# The internal services' (daemon, worker) setting; the scheduler's callers are tenants.
InternalAuthSetting = Annotated[
    InternalAuth,
    Field(default_factory=InternalAuth, description="who may call besides health checks; unset = anyone"),
]


class ServiceSettings(FileBackedSettings):
    listen_address: ListenAddress
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Prometheus /metrics port; 0 = any free one (logged); unset = off"
    )
    ready_file: Path | None = Field(
        None, description="written with the bound gRPC and metrics ports (JSON) once serving"
    )
    parent_watch_fd: int | None = Field(
        None,
        ge=0,
        description="read end of a pipe from the process that started this one: its end of file "
        "(that process died, even by SIGKILL) stops the service gracefully; unset = not watched",
    )
    tls: ServerTLS = Field(
        default_factory=ServerTLS,
        description="TLS of the gRPC server (require_client_cert: mutual TLS); unset = plaintext",
    )
    serving: ServingLimits = Field(
        default_factory=ServingLimits,
        description="load limits of the gRPC server: calls at once (a stream counts until it ends)",
    )
    shutdown_grace_seconds: float = Field(ge=0, description="on SIGTERM, in-flight calls get this long")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="minimum log level")
    log_json: bool = Field(True, description="JSON log lines (false: key=value for a terminal)")
