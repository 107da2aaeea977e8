"""Scheduler settings (environment variables `ATTNSTORE_SCHEDULER_*`, or a TOML file named
by `ATTNSTORE_SCHEDULER_CONFIG_FILE`). Each default is written here once."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict

from attnstore.kvstore_client.limits import MAX_KEYS_PER_REQUEST
from attnstore.prompt_modules import DEFAULT_LIMITS, PmlLimits
from attnstore.security import ChannelSecurity
from attnstore.server.ports import DAEMON_PORT, SCHEDULER_PORT, WORKER_PORT
from attnstore.server.service_settings import ListenAddress, ServiceSettings


class NodeSpec(BaseModel, frozen=True):
    """One node of a static topology: its daemon and the workers beside it."""

    name: str = Field(min_length=1, max_length=253)
    daemon_address: str | None = Field(None, description="host:port of the node's daemon; None = no cache")
    worker_addresses: tuple[str, ...] = Field(min_length=1)


class HintSettings(BaseModel, frozen=True):
    """The look-ahead hint pusher (hint_pusher.py); nested as `hints`."""

    model_config = ConfigDict(extra="forbid")

    min_interval_seconds: float = Field(
        0.2, ge=0, description="after a push the next waits this long; the queue changes in between coalesce"
    )
    refresh_seconds: float = Field(
        15.0, gt=0, description="pushed again this often without changes; keep it under the daemons' hint TTL"
    )
    ttl_seconds: int = Field(
        0, ge=0, description="how long the daemons keep the hints; 0 = the daemon's default"
    )
    release_seconds: float = Field(
        60.0, gt=0, description="chunks of an ended or moved session are hinted EVICT_FIRST this long"
    )
    max_keys_per_call: int = Field(
        MAX_KEYS_PER_REQUEST,
        ge=1,
        description="keys per Hint call; at most the daemons' max_keys_per_request",
    )
    policy: Literal["lookahead", "predictive"] = Field(
        "lookahead",
        description="lookahead hints the queue only; predictive also predicts every live session's next use "
        "(pair it with the daemons' eviction_policy=predictive)",
    )
    predict_interval_seconds: float = Field(
        5.0,
        gt=0,
        description="predictive: the predictions of every live session are pushed at most this often",
    )
    source: str = Field(
        "",
        max_length=128,
        description="this replica's name in its hints; empty = the host name (unique per pod)",
    )


class SchedulerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="ATTNSTORE_SCHEDULER_", extra="forbid")

    listen_address: ListenAddress = f"127.0.0.1:{SCHEDULER_PORT}"
    openai_listen_address: str | None = Field(
        None,
        description="host:port of the OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, "
        "/v1/models, /health, /metrics); unset = off",
    )
    openai_max_request_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="largest request body the OpenAI-compatible API accepts"
    )
    daemon_channel: ChannelSecurity = Field(
        default_factory=ChannelSecurity,
        description="TLS and internal token of the calls to the daemons (an admin token: hints, stats)",
    )
    worker_channel: ChannelSecurity = Field(
        default_factory=ChannelSecurity, description="TLS and internal token of the calls to the workers"
    )

    redis_url: str | None = Field(
        None,
        description="session metadata in this Redis (redis://host:port/db); unset = an embedded "
        "in-process store (one replica only; sessions are lost when the scheduler stops)",
    )
    redis_max_connections: int = Field(
        100, ge=1, description="connections to Redis per replica; a call finding all busy waits for one"
    )
    redis_pool_timeout_seconds: float = Field(
        5.0, gt=0, description="longest a call waits for a free Redis connection, then UNAVAILABLE"
    )
    api_keys_file: Path | None = Field(
        None, description="YAML/JSON file: tenant -> list of sha256 hex digests of its API keys"
    )
    auth_enabled: bool = Field(
        True, description="require an API key; false = every caller is tenant 'default' (development)"
    )
    admin_tenant: str = Field(
        "admin", description="keys of this tenant in api_keys_file may act on any tenant's sessions"
    )

    nodes: list[NodeSpec] = Field(
        default_factory=list,
        description="static topology: [{name, daemon_address, worker_addresses}] (JSON in the environment)",
    )
    kubernetes_discovery: bool = Field(
        False, description="find daemons and workers by watching pods (node = spec.nodeName)"
    )
    kubernetes_namespace: str = Field("default", description="namespace of the watched pods")
    kubernetes_daemon_selector: str = Field(
        "app.kubernetes.io/component=kvstore-daemon", description="label selector of daemon pods"
    )
    kubernetes_worker_selector: str = Field(
        "app.kubernetes.io/component=inference-worker", description="label selector of worker pods"
    )
    kubernetes_daemon_port: int = Field(
        DAEMON_PORT, ge=1, le=65535, description="daemon gRPC port when its pod names no port 'grpc'"
    )
    kubernetes_worker_port: int = Field(
        WORKER_PORT, ge=1, le=65535, description="worker gRPC port when its pod names no port 'grpc'"
    )

    session_ttl_seconds: int = Field(3600, ge=1, description="default session TTL (inactivity)")
    max_session_ttl_seconds: int = Field(7 * 86400, ge=1, description="longest TTL a session may ask for")
    max_message_chars: int = Field(
        100_000, ge=1, description="longest user message, system prompt or prompt, in characters"
    )
    max_session_tokens: int = Field(
        32768, ge=1, description="most tokens a conversation may grow to (history plus the new answer)"
    )
    max_sessions_per_tenant: int = Field(10_000, ge=1, description="live sessions one tenant may hold")
    max_kv_bytes_per_tenant: int | None = Field(
        None,
        ge=1,
        description="KV one tenant's sessions may hold: their history tokens x the model's KV bytes per "
        "token; unset = bounded only by max_sessions_per_tenant x max_session_tokens",
    )
    max_schemas_per_tenant: int = Field(64, ge=1, description="PML schemas one tenant may register")
    schema_encoding: Literal["eager", "lazy"] = Field(
        "eager",
        description="eager: a worker encodes every module of a schema at RegisterSchema (progress streamed); "
        "lazy: each module is encoded by the first prompt that imports it",
    )
    schema_encode_timeout_seconds: float = Field(
        600.0, gt=0, description="longest eager encoding of one schema on a worker"
    )
    pml_schema_bytes_max: int = Field(
        DEFAULT_LIMITS.schema_bytes_max,
        ge=1,
        description="largest PML schema or prompt document, in UTF-8 bytes",
    )
    pml_modules_per_schema_max: int = Field(
        DEFAULT_LIMITS.modules_per_schema_max, ge=1, description="most modules in one schema, at every depth"
    )
    pml_param_len_max: int = Field(
        DEFAULT_LIMITS.param_len_max, ge=1, description="most positions one <param len> may reserve"
    )
    requests_per_second: float = Field(50.0, gt=0, description="sustained calls per second per tenant")
    requests_burst: int = Field(100, ge=1, description="calls a tenant may make at once above the rate")
    max_queue_length: int = Field(1024, ge=1, description="turns waiting for a worker; more are refused")
    pool_routing_min_share: float | None = Field(
        1.0,
        gt=0,
        le=1,
        description="send a session's turn to the node of a pool peer holding at least this share of its "
        "stored prefix, as one leading run (pool_routing.py; needs redis_url, the pool's ledger); "
        "null = route by the session's node only",
    )
    hints: HintSettings = Field(
        default_factory=HintSettings, description="look-ahead hints to the daemons (prefetch, eviction order)"
    )
    default_max_tokens: int = Field(256, ge=1, description="max_tokens of a turn that names none")
    max_samples: int = Field(
        8,
        ge=1,
        description="largest n (answers drawn from one prompt) a Generate or OpenAI request may ask for",
    )

    turn_retry_attempts: int = Field(
        2, ge=0, description="workers tried again after one fails mid-turn (replayed on another worker)"
    )
    turn_timeout_seconds: float = Field(300.0, gt=0, description="longest one worker attempt may take")
    max_turns_per_worker: int = Field(4, ge=1, description="turns one worker runs at once")
    long_context_peers: int = Field(
        16,
        ge=0,
        description="most other healthy workers named to a worker with each turn (ExecuteTurnRequest."
        "long_context_peers), the least busy first: where a worker with long_context.peers_from_scheduler "
        "may place the oldest KV of a turn longer than its KV pool; 0 = none",
    )
    worker_health_interval_seconds: float = Field(
        2.0, gt=0, description="period of the health check of every worker"
    )
    worker_health_timeout_seconds: float = Field(2.0, gt=0, description="deadline of one health check")

    session_lock_ttl_seconds: float = Field(
        30.0, gt=0, description="a turn's session lock expires this long after its holder stops renewing it"
    )
    session_lock_wait_seconds: float = Field(
        600.0, gt=0, description="longest a turn waits for the session's previous turn"
    )
    expiry_sweep_interval_seconds: float = Field(
        1.0, gt=0, description="period of the sweep that releases expired sessions' KV"
    )
    expiry_grace_seconds: int = Field(
        3600, ge=1, description="an expired session's record stays this long for the sweeper to find"
    )
    release_timeout_seconds: float = Field(5.0, gt=0, description="deadline of a daemon call releasing KV")

    health_check_interval_seconds: float = Field(
        5.0, gt=0, description="period of the scheduler's own health probe (its session store answers)"
    )
    shutdown_grace_seconds: float = Field(30.0, ge=0, description="on SIGTERM, in-flight turns get this long")

    @property
    def pml_limits(self) -> PmlLimits:
        return PmlLimits(
            schema_bytes_max=self.pml_schema_bytes_max,
            prompt_bytes_max=self.pml_schema_bytes_max,
            modules_per_schema_max=self.pml_modules_per_schema_max,
            param_len_max=self.pml_param_len_max,
        )

    @model_validator(mode="after")
    def _check_consistency(self) -> SchedulerSettings:
        if self.auth_enabled and self.api_keys_file is None:
            raise ValueError("auth_enabled needs api_keys_file (or set auth_enabled=false for development)")
        if bool(self.nodes) == self.kubernetes_discovery:
            raise ValueError("give exactly one topology source: nodes, or kubernetes_discovery=true")
        names = [node.name for node in self.nodes]
        if len(names) != len(set(names)):
            raise ValueError("node names must be unique")
        if self.session_ttl_seconds > self.max_session_ttl_seconds:
            raise ValueError("session_ttl_seconds must not exceed max_session_ttl_seconds")
        return self
