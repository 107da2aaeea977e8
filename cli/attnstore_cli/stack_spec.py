"""What a local stack is made of (the input of `LocalStack`): how many daemons, which
workers on which nodes, the session store, authentication, TLS and each service's
settings.

Settings are passed through by field name (as the services' pydantic settings read them,
`{"dram_capacity_bytes": 1 << 26}`), so a setting a service gains needs no change here.
Later layers win: the stack's own (log level, TLS, internal auth) < the service's
settings < one worker's settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from attnstore.security import token_digest

Settings = Mapping[str, object]
SessionStoreChoice = Literal["auto", "redis", "embedded"]


@dataclass(frozen=True)
class WorkerSpec:
    """One inference worker. `node`: its node in the scheduler's topology (default: its
    name); `daemon`: the index of the daemon it uses, None for none (it recomputes every
    turn, and no node has it)."""

    name: str
    node: str | None = None
    daemon: int | None = 0
    settings: Settings = field(default_factory=dict)

    @property
    def node_name(self) -> str:
        return self.node or self.name


@dataclass(frozen=True)
class StackTls:
    """TLS on every endpoint, from one CA: daemons and workers require client
    certificates (mutual TLS); the scheduler's public API takes any TLS client."""

    ca_file: Path
    server_cert_file: Path
    server_key_file: Path
    client_cert_file: Path
    client_key_file: Path

    def server(self, *, mutual: bool) -> dict[str, object]:
        tls: dict[str, object] = {"cert_file": self.server_cert_file, "key_file": self.server_key_file}
        if mutual:
            tls |= {"client_ca_file": self.ca_file, "require_client_cert": True}
        return tls

    def client(self) -> dict[str, object]:
        return {
            "tls": True,
            "ca_file": self.ca_file,
            "cert_file": self.client_cert_file,
            "key_file": self.client_key_file,
        }


@dataclass(frozen=True)
class InternalAuth:
    """Tokens between the services: workers present the worker token to their daemon; the
    scheduler presents the admin token to daemons and workers."""

    worker_token_file: Path
    admin_token_file: Path

    def server(self) -> dict[str, object]:
        return {
            "enabled": True,
            "token_sha256": [token_digest(self.worker_token_file.read_text().strip())],
            "admin_token_sha256": [token_digest(self.admin_token_file.read_text().strip())],
        }


@dataclass(frozen=True)
class StackSpec:
    """`work_dir` holds the SSD tiers, Redis' files, the API keys file and the logs (kept:
    a restart finds the SSD tier and Redis' data). `model_dir` None: the default model.
    `session_store`: "redis" starts a private Redis (needs redis-server), "auto" when it
    is installed; `redis_url` uses that Redis instead. `api_keys` (tenant -> key) turns
    authentication on. `scheduler` False: daemons and workers only. `own_sessions`: each
    child in its own session, so a terminal's Ctrl-C reaches only the parent, which then
    stops the services in order. `daemon_nodes` names the node each daemon stands for in
    the pool's ledger (several daemons on one machine as several nodes); without it a
    daemon takes its workers' node."""

    work_dir: Path
    model_dir: Path | None = None
    daemons: int = 1
    workers: tuple[WorkerSpec, ...] = (WorkerSpec("local"),)
    scheduler: bool = True
    scheduler_port: int = 0  # 0: a free one
    session_store: SessionStoreChoice = "embedded"
    redis_url: str | None = None
    api_keys: Mapping[str, str] | None = None
    tls: StackTls | None = None
    internal_auth: InternalAuth | None = None
    daemon_settings: Settings = field(default_factory=dict)
    worker_settings: Settings = field(default_factory=dict)
    scheduler_settings: Settings = field(default_factory=dict)
    log_level: str | None = None  # every service's, under the settings above
    own_sessions: bool = False
    daemon_nodes: tuple[str, ...] = ()  # each daemon's node in the pool (pool_node); () = its workers'

    def __post_init__(self) -> None:
        names = [worker.name for worker in self.workers]
        if len(set(names)) != len(names):
            raise ValueError(f"worker names must differ: {names}")
        if self.daemon_nodes and len(self.daemon_nodes) != self.daemons:
            raise ValueError(f"daemon_nodes names {len(self.daemon_nodes)} nodes for {self.daemons} daemons")
        daemon_of_node: dict[str, int] = {}
        for worker in self.workers:
            if worker.daemon is None:
                continue
            if not 0 <= worker.daemon < self.daemons:
                raise ValueError(
                    f"worker {worker.name!r}: no daemon {worker.daemon} in a stack of {self.daemons}"
                )
            if daemon_of_node.setdefault(worker.node_name, worker.daemon) != worker.daemon:
                raise ValueError(f"node {worker.node_name!r}: its workers name different daemons")
            if self.daemon_nodes and self.daemon_nodes[worker.daemon] != worker.node_name:
                raise ValueError(
                    f"worker {worker.name!r} is on node {worker.node_name!r}, its daemon on "
                    f"{self.daemon_nodes[worker.daemon]!r}"
                )

    def daemon_node(self, index: int) -> str | None:
        """The node daemon `index` stands for: `daemon_nodes`, else its workers' node (None
        when no worker, or workers of several nodes, use it)."""
        if self.daemon_nodes:
            return self.daemon_nodes[index]
        nodes = {worker.node_name for worker in self.workers if worker.daemon == index}
        return nodes.pop() if len(nodes) == 1 else None

    def _base(self) -> dict[str, object]:
        return {"log_level": self.log_level} if self.log_level is not None else {}

    def _channel(self, token_file: Path | None) -> dict[str, object]:
        channel = self.tls.client() if self.tls is not None else {}
        if token_file is not None:
            channel["token_file"] = token_file
        return channel

    def _server_security(self, *, mutual_tls: bool, internal_auth: bool) -> dict[str, object]:
        security: dict[str, object] = {}
        if self.tls is not None:
            security["tls"] = self.tls.server(mutual=mutual_tls)
        if internal_auth and self.internal_auth is not None:
            security["internal_auth"] = self.internal_auth.server()
        return security

    def daemon_service_settings(self, index: int | None = None) -> dict[str, object]:
        """Daemon `index`'s settings (its node as `pool_node` when it has one); None: what
        every daemon shares."""
        security = self._server_security(mutual_tls=True, internal_auth=True)
        node = self.daemon_node(index) if index is not None else None
        return {**self._base(), **({"pool_node": node} if node else {}), **security, **self.daemon_settings}

    def worker_service_settings(self, worker: WorkerSpec) -> dict[str, object]:
        security = self._server_security(mutual_tls=True, internal_auth=True)
        token = self.internal_auth.worker_token_file if self.internal_auth is not None else None
        if channel := self._channel(token):
            security["kvstore_channel"] = channel
        return {**self._base(), **security, **self.worker_settings, **worker.settings}

    def scheduler_service_settings(self) -> dict[str, object]:
        security = self._server_security(mutual_tls=False, internal_auth=False)
        token = self.internal_auth.admin_token_file if self.internal_auth is not None else None
        if channel := self._channel(token):
            security |= {"daemon_channel": channel, "worker_channel": channel}
        return {**self._base(), **security, **self.scheduler_settings}
