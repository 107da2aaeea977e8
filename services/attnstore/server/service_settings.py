"""The settings every gRPC service of attnstore has: where it serves, how it reports,
how it stops. Each service adds its own and names its own address and grace period
(their defaults differ: daemon 50051, worker 50061, scheduler 50071)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from attnstore.security import ServerTLS
from attnstore.server.concurrency import ServingLimits
from attnstore.settings import FileBackedSettings


class ServiceSettings(FileBackedSettings):
    listen_address: str = Field(description="host:port of the gRPC server; port 0 picks one")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Prometheus /metrics port; unset = off")
    ready_file: Path | None = Field(None, description="written with the bound port once serving")
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
