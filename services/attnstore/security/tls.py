"""TLS settings shared by the services, nested in each service's settings: `ServerTLS`
for its own gRPC endpoint, `ChannelSecurity` for each outgoing channel (scheduler to
daemons and workers, worker to its daemon). In the environment either as JSON
(`ATTNSTORE_DAEMON_TLS='{"cert_file": ...}'`) or one variable per field
(`ATTNSTORE_DAEMON_TLS__CERT_FILE=...`); in a TOML file as a table (`[tls]`). Unset, every
endpoint is plaintext, as in local development. Files are read by `load()` at start."""

from __future__ import annotations

import ssl
from concurrent import futures
from pathlib import Path

import grpc
from pydantic import BaseModel, ConfigDict, Field, model_validator

from attnstore.security.credentials import ClientCredentials, SecurityConfigError, read_secret_file


class ServerTLS(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cert_file: Path | None = Field(
        None, description="PEM certificate chain of this server; unset = plaintext (no TLS)"
    )
    key_file: Path | None = Field(None, description="PEM private key of cert_file")
    client_ca_file: Path | None = Field(
        None, description="PEM CA bundle that signs the client certificates (mutual TLS)"
    )
    require_client_cert: bool = Field(
        False, description="mutual TLS: refuse connections without a certificate signed by client_ca_file"
    )
    health_listen_address: str | None = Field(
        None,
        min_length=1,
        description="host:port of a plaintext port serving only grpc.health.v1, for probes that speak no "
        "TLS (Kubernetes' gRPC probes); unset = health only on the TLS port",
    )

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    @model_validator(mode="after")
    def _check(self) -> ServerTLS:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.require_client_cert and self.client_ca_file is None:
            raise ValueError("require_client_cert needs client_ca_file (the CA of the client certificates)")
        if self.client_ca_file is not None and not self.require_client_cert:
            raise ValueError("client_ca_file is used only with require_client_cert=true")
        if self.require_client_cert and not self.enabled:
            raise ValueError("require_client_cert needs cert_file and key_file (mutual TLS is TLS)")
        if self.health_listen_address is not None and not self.enabled:
            raise ValueError(
                "health_listen_address is for TLS servers (a plaintext port serves health already)"
            )
        return self

    def load(self) -> grpc.ServerCredentials | None:
        """The server's credentials, files read now; None: plaintext."""
        if self.cert_file is None or self.key_file is None:
            return None
        key = read_secret_file(self.key_file, "tls.key_file")
        pair = (key, read_secret_file(self.cert_file, "tls.cert_file"))
        client_ca = (
            read_secret_file(self.client_ca_file, "tls.client_ca_file") if self.client_ca_file else None
        )
        credentials = grpc.ssl_server_credentials(
            [pair], root_certificates=client_ca, require_client_auth=self.require_client_cert
        )
        _check_accepted(credentials)
        return credentials


def _check_accepted(credentials: grpc.ServerCredentials) -> None:
    """grpc parses a certificate and key only when a port is added; a throwaway server on a
    free port tells at load time, so a bad pair is not mistaken for a busy address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    try:
        server.add_secure_port("127.0.0.1:0", credentials)
    except RuntimeError as exc:
        raise SecurityConfigError(
            "tls: grpc refused tls.cert_file or tls.key_file (not PEM, or a key of another certificate; "
            "its log line above says which)"
        ) from exc
    finally:
        server.stop(None)


class ChannelSecurity(BaseModel):
    """How this process dials another service: TLS, its client certificate when the server
    requires one, and the internal token the daemon and the worker check (internal_auth)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tls: bool = Field(False, description="dial with TLS (false: plaintext)")
    ca_file: Path | None = Field(
        None, description="PEM CA bundle that signs the server's certificate; unset = the system's roots"
    )
    cert_file: Path | None = Field(
        None, description="PEM client certificate chain, for servers that require one (mutual TLS)"
    )
    key_file: Path | None = Field(None, description="PEM private key of cert_file")
    server_name: str | None = Field(
        None,
        min_length=1,
        description="name the server's certificate must carry; unset = the host of the address "
        "(set it when dialing pods by IP)",
    )
    token_file: Path | None = Field(
        None, description="file holding the internal token, sent as 'authorization: Bearer' on every call"
    )

    @model_validator(mode="after")
    def _check(self) -> ChannelSecurity:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        names = ("ca_file", "cert_file", "server_name", "token_file")
        given = [name for name in names if getattr(self, name) is not None]
        if given and not self.tls:
            raise ValueError(f"{', '.join(given)} need tls=true (a token is never sent in clear text)")
        return self

    def ssl_context(self) -> ssl.SSLContext | None:
        """The same trust and client certificate for a raw TLS socket (a daemon's data
        plane), files read now; None: plaintext."""
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(
                cafile=str(self.ca_file) if self.ca_file is not None else None
            )
            if self.cert_file is not None and self.key_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except OSError as exc:  # ssl.SSLError included: a file that is missing or no PEM
            raise SecurityConfigError(
                f"cannot load the TLS files of {self.ca_file}, {self.cert_file}: {exc}"
            ) from exc
        return context

    def load(self, setting: str) -> ClientCredentials | None:
        """The channel's credentials, files read now; None: plaintext. `setting` names this
        channel's setting in error messages."""
        if not self.tls:
            return None

        def read(path: Path | None, field: str) -> bytes | None:
            return read_secret_file(path, f"{setting}.{field}") if path is not None else None

        token = read(self.token_file, "token_file")
        return ClientCredentials.from_pem(
            read(self.ca_file, "ca_file"),
            certificate_chain=read(self.cert_file, "cert_file"),
            private_key=read(self.key_file, "key_file"),
            server_name=self.server_name,
            token=token.decode().strip() if token is not None else None,
        )
