"""Daemon settings (environment variables `ATTNSTORE_DAEMON_*`, or a TOML file named
by `ATTNSTORE_DAEMON_CONFIG_FILE`). Each default is written here once."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from attnstore.kvstore_client.limits import MAX_KEYS_PER_REQUEST
from attnstore.pool_ledger import LendingLimits
from attnstore.security import ChannelSecurity, check_server_security
from attnstore.server.ports import DAEMON_PORT
from attnstore.server.service_settings import InternalAuthSetting, ListenAddress, ServiceSettings
from kvstore_daemon.chunk_lives import GHOST_KEYS_MAX, NAMED_KEYS_MAX
from kvstore_daemon.order_chooser import SWITCH_Z
from kvstore_daemon.ssd_tier import DEFAULT_IO_THREADS

MiB = 1024 * 1024
GiB = 1024 * MiB


class DaemonSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="ATTNSTORE_DAEMON_", extra="forbid")

    listen_address: ListenAddress = f"127.0.0.1:{DAEMON_PORT}"
    internal_auth: InternalAuthSetting

    data_plane_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="TCP port of the data plane (chunk bytes for readers on other nodes), on listen_address's host; 0 = off",
    )
    data_plane_idle_timeout_seconds: float = Field(
        30.0, gt=0, description="a data-plane connection silent this long (or stalled mid-frame) is closed"
    )
    data_plane_max_connections: int = Field(
        256, ge=1, description="open data-plane connections at once (a thread each)"
    )
    data_plane_max_frame_bytes: int = Field(
        1 * MiB, ge=4096, description="largest data-plane request frame (msgpack; chunk bytes are not framed)"
    )
    data_plane_c_reads: bool = Field(
        True,
        description="answer repeated unheld reads of DRAM chunks in C, no Python (plain TCP; needs a C compiler)",
    )
    data_plane_send_buffer_bytes: int = Field(
        8 * MiB, ge=0,
        description="SO_SNDBUF asked for on each data-plane connection, so a chunk's send need not wait for room; "
        "only where the kernel grants more than its autotuning reaches (2 x net.core.wmem_max over tcp_wmem's "
        "max); 0 = the kernel's autotuning",
    )  # fmt: skip
    data_plane_c_read_entries: int = Field(
        65536, ge=1, description="DRAM chunks the C read path knows at once (the rest are served by Python)"
    )

    pool_peers: list[str] = Field(
        default_factory=list,
        description="gRPC addresses of peer daemons that take chunks this one evicts from SSD, tried in order "
        "(JSON list)",
    )
    pool_channel: ChannelSecurity = Field(
        default_factory=ChannelSecurity,
        description="TLS (the peers' CA, this daemon's client certificate) and internal token of this daemon's "
        "calls to its pool peers, gRPC and data plane; needed when the daemons run with tls or internal_auth",
    )
    pool_redis_url: str | None = Field(
        None,
        description="the scheduler's Redis, holding the pool's ledger: this daemon heartbeats into it and takes "
        "its peers from it (instead of pool_peers); unset = no ledger",
    )
    pool_node: str = Field(
        "", description="the node this daemon serves, in the ledger; empty = the host name"
    )
    pool_advertise_address: str | None = Field(
        None,
        description="host:port peers reach this daemon's gRPC at; unset = listen_address with the bound port",
    )
    pool_heartbeat_seconds: float = Field(
        2.0, gt=0, description="ledger heartbeat period; 3 missed = forgotten"
    )
    pool_own_floor_fraction: float = Field(
        0.2,
        ge=0,
        le=1,
        description="share of its SSD tier a daemon keeps free for its own node (lends none of it)",
    )
    pool_max_lent_fraction: float = Field(
        0.5, ge=0, le=1, description="share of its SSD tier a daemon may lend"
    )
    pool_replace_borrowed: bool = Field(
        True,
        description="a lender at its limits evicts what it holds for borrowers (least recently placed or read "
        "first) to take newer borrowed chunks, as one LRU over the pool would; false = it refuses them",
    )
    pool_capacity_bytes: int = Field(
        0, ge=0, description="bytes this daemon may place on peers in all; 0 = off"
    )
    pool_place_dram_evictions: bool = Field(
        False,
        description="place chunks evicted from DRAM on a peer (into its DRAM) instead of writing them to the "
        "local SSD; the SSD then takes only what no peer takes",
    )
    pool_peer_timeout_seconds: float = Field(
        5.0, gt=0, description="bounds every call to a peer (a partitioned peer costs this, then a miss)"
    )

    dram_capacity_bytes: int = Field(1 * GiB, ge=MiB, description="size of the shared-memory arena")
    dram_block_bytes: int = Field(2 * MiB, ge=4096, description="arena block size (allocation unit)")
    shm_dir: Path = Field(Path("/dev/shm"), description="directory of the arena file (a tmpfs)")
    dram_high_watermark: float = Field(0.95, gt=0, le=1, description="start demoting above this fill ratio")
    dram_low_watermark: float = Field(0.85, gt=0, le=1, description="demote down to this fill ratio")

    ssd_dirs: list[Path] = Field(
        default_factory=lambda: [Path("/var/lib/attnstore/ssd")],
        min_length=1,
        description="SSD tier directories, written round-robin (JSON list in the environment)",
    )
    ssd_capacity_bytes: int = Field(16 * GiB, ge=MiB, description="total bytes across ssd_dirs")
    ssd_reserved_bytes: int = Field(
        64 * MiB,
        ge=0,
        description="left free on the SSD file systems (the namespace file, other programs); the tier shrinks to fit",
    )
    ssd_high_watermark: float = Field(0.95, gt=0, le=1, description="start deleting above this fill ratio")
    ssd_low_watermark: float = Field(0.90, gt=0, le=1, description="delete down to this fill ratio")
    persist_on_commit: bool = Field(True, description="write every committed chunk to SSD in the background")
    io_threads: int = Field(DEFAULT_IO_THREADS, ge=1, le=64, description="threads doing SSD file I/O")

    eviction_policy: Literal["lru", "fifo", "lookahead", "predictive"] = Field(
        "lookahead",
        description="victim order of both tiers; lookahead follows the scheduler's queue hints, predictive its "
        "predicted next use of every live chunk and the hit density it learns (and declines chunks it names DECLINE)",
    )
    declined_admission: Literal["refuse", "ssd_only"] = Field(
        "refuse",
        description="predictive: a write of a chunk hinted DECLINE is refused, or stored on SSD only, first to go "
        "(for clients that may send an ended session's prefix again)",
    )
    predictive_shadow_share: float = Field(
        0.25,
        ge=0,
        le=1,
        description="predictive: share of the keys (by hash) on which two shadow caches, one per order, decide "
        "whether the SSD tier follows the predictive order or LRU (whichever hit more lately); 0: always predictive",
    )
    predictive_shadow_switch_z: float = Field(
        SWITCH_Z,
        ge=0,
        description="predictive: the other order's shadow takes over once its lead in the requests only one shadow "
        "hit is more than this many standard errors (sqrt of their sum); higher switches less on noise",
    )

    predictive_prefetch_dram_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="predictive: share of DRAM the soonest-predicted SSD-only chunks are moved into when "
        "predictions arrive (more of the hits from DRAM, fewer hits); 0: only the queue's chunks are prefetched",
    )
    predictive_ghost_keys_max: int = Field(
        GHOST_KEYS_MAX,
        ge=0,
        description="predictive: evicted keys remembered so that a lookup naming one again, or a store, counts it "
        "as read at that age in what the order learns (about 150 bytes each)",
    )
    predictive_named_keys_max: int = Field(
        NAMED_KEYS_MAX,
        ge=0,
        description="predictive: keys whose lookups are counted (the least recently named forgotten), so that a chunk "
        "stored after lookups asked for it is in another class than one never asked for (about 150 bytes each); "
        "0: a chunk's class counts only its reads in the store",
    )

    max_chunk_bytes: int = Field(64 * MiB, ge=4096, description="largest chunk accepted")
    max_keys_per_request: int = Field(
        MAX_KEYS_PER_REQUEST, ge=1, description="keys (or write ids) one call may name"
    )
    max_get_message_bytes: int = Field(
        4 * MiB, ge=64 * 1024, description="target size of one Get stream message"
    )
    reservation_ttl_seconds: float = Field(
        30.0, gt=0, description="uncommitted writes are dropped after this"
    )
    lease_ttl_seconds: float = Field(10.0, gt=0, description="default read-lease TTL")
    max_lease_ttl_seconds: float = Field(300.0, gt=0, description="longest read lease a client may ask for")
    pin_ttl_seconds: float = Field(600.0, gt=0, description="default pin TTL")
    max_pin_ttl_seconds: float = Field(3600.0, gt=0, description="longest pin a client may ask for")
    hint_ttl_seconds: float = Field(60.0, gt=0, description="default look-ahead hint TTL")
    # One namespace per tenant x model x dtype x chunk size: thousands of tenants on a node
    # with a model or two. An entry costs about 120 bytes in namespaces.msgpack, which is
    # rewritten on every new registration (8,192 entries: 0.95 MB, 5 ms with fsync).
    max_namespaces: int = Field(8192, ge=1, description="registered namespaces the daemon keeps")
    namespace_idle_seconds: float = Field(
        900.0,
        gt=0,
        description="a namespace unused this long and holding nothing may be reclaimed when the table is full",
    )
    namespace_registrations_per_second: float = Field(
        20.0, gt=0, description="new namespaces one caller (peer host) may register per second, sustained"
    )
    namespace_registration_burst: int = Field(
        200, ge=1, description="new namespaces one caller may register at once (a worker's start)"
    )
    shutdown_grace_seconds: float = Field(
        10.0, ge=0, description="in-flight calls and SSD writes get this long on SIGTERM"
    )

    @property
    def lending_limits(self) -> LendingLimits:
        return LendingLimits(
            self.pool_own_floor_fraction, self.pool_max_lent_fraction, self.pool_replace_borrowed
        )

    @property
    def pool_node_name(self) -> str:
        """The node this daemon is in the pool: `pool_node`, else the host name."""
        return self.pool_node or socket.gethostname()

    @model_validator(mode="after")
    def _check_consistency(self) -> DaemonSettings:
        if self.dram_capacity_bytes < self.dram_block_bytes:
            raise ValueError("dram_capacity_bytes must hold at least one dram_block_bytes block")
        if self.dram_low_watermark > self.dram_high_watermark:
            raise ValueError("dram_low_watermark must not exceed dram_high_watermark")
        if self.ssd_low_watermark > self.ssd_high_watermark:
            raise ValueError("ssd_low_watermark must not exceed ssd_high_watermark")
        if self.max_chunk_bytes > self.dram_capacity_bytes:
            raise ValueError("max_chunk_bytes must fit in dram_capacity_bytes")
        check_server_security(self.tls, self.internal_auth)
        pooled = bool(self.pool_peers) or self.pool_redis_url is not None
        if pooled and (self.tls.enabled or self.internal_auth.enabled) and not self.pool_channel.tls:
            raise ValueError(
                "the peers of a daemon with tls or internal_auth need pool_channel.tls to be called"
            )
        channel = self.pool_channel
        if pooled and self.internal_auth.enabled and channel.token_file is None and channel.cert_file is None:
            raise ValueError(
                "the peers of a daemon with internal_auth need pool_channel.token_file or cert_file"
            )
        if self.pool_peers and self.pool_redis_url is not None:
            raise ValueError(
                "pool_peers and pool_redis_url exclude each other (a static pool, or the ledger's)"
            )
        return self
