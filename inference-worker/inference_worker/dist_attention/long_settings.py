"""Turns longer than the worker's KV pool holds (WorkerSettings.long_context): where their
oldest KV may go, and how long a context may get."""

from __future__ import annotations

import socket

from pydantic import BaseModel, Field

from attnstore.security import ChannelSecurity


class DgfmSettings(BaseModel):
    """Debt-graph defragmentation between workers (dgfm.py)."""

    period_seconds: float = Field(
        5.0, gt=0, description="how often a worker with live long turns looks for cycles of debts"
    )
    min_swap_bytes: int = Field(
        4 << 20, ge=1, description="smallest debt worth a recall: smaller edges are left out of the search"
    )


class LongContextSettings(BaseModel):
    peers: list[str] = Field(
        default_factory=list,
        description="host:port of peer workers whose MicroAttention may hold the oldest KV of this worker's "
        "long turns; empty = a turn whose KV does not fit the pool is refused (RESOURCE_EXHAUSTED)",
    )
    peers_from_scheduler: bool = Field(
        False,
        description="also place on the workers each turn names (ExecuteTurnRequest.long_context_peers: the "
        "scheduler's other healthy workers), so long turns need no static peers list",
    )
    max_turn_peers: int = Field(
        64, ge=0, description="most long_context_peers one turn may name; more is INVALID_ARGUMENT"
    )
    max_context_tokens: int = Field(
        131072,
        ge=1,
        description="longest context (kept prompt + max_tokens) a turn may have across this worker and its "
        "peers; a longer one is refused (RESOURCE_EXHAUSTED)",
    )
    segment_tokens: int = Field(
        4096,
        ge=1,
        description="most tokens of one segment placed on a peer (one AppendKV series, one release); at most "
        "the KV pool's tokens less one block (a segment is prefilled in the pool)",
    )
    peer_timeout_seconds: float = Field(
        10.0, gt=0, description="longest wait for one call to a peer; past it the peer counts as lost"
    )
    advertise_address: str = Field(
        "",
        description="host:port at which other workers reach this worker's MicroAttention (as they list it in "
        "their peers): names this worker as the home of the KV it places, so DGFM can recall it; empty = "
        "this worker takes no part in DGFM",
    )
    advertise_kvstore_address: str = Field(
        "",
        description="host:port at which other workers reach this worker's KV-store daemon (its kvstore_address "
        "as seen from them), reported in DescribeLending: a long turn's home then puts the segments it places "
        "here in that daemon and attaches them (AttachChunks) instead of appending them (AppendKV); empty = "
        "homes append; needs kvstore_address",
    )
    pool_redis_url: str | None = Field(
        None,
        description="the pool ledger's Redis (the daemons' pool_redis_url): long turns also place on the lender "
        "workers the ledger lists (so no peers list is needed), each peer's room capped by what the ledger says "
        "the daemon it lends through may lend (DescribeLending.pool_daemon); with advertise_address this worker "
        "lists itself there as a lender; unset = the peers lists and their DescribeLending room alone",
    )
    pool_node: str = Field(
        "",
        description="the node this worker runs on, as its daemon's pool_node: lenders from the ledger on the same "
        "node are proposed first, and a lender lists itself on it; empty = the host name",
    )
    ledger_peers: int = Field(
        16,
        ge=0,
        description="most lenders a placement takes from the ledger (same node first, then by their daemons' "
        "lendable bytes), each asked its room (DescribeLending); 0 = none (the ledger only caps the peers' room)",
    )
    lender_ttl_seconds: float = Field(
        15.0,
        gt=0,
        description="how long this worker's lender entry and its debts in the ledger live unless renewed "
        "(every third of it): a lender killed is proposed to homes, and counted in DGFM's graph, at most this long",
    )
    dgfm: DgfmSettings = Field(default_factory=DgfmSettings, description="debt-graph defragmentation")
    peer_channel: ChannelSecurity = Field(
        default_factory=ChannelSecurity, description="TLS and internal token of the calls to the peers"
    )

    @property
    def pool_node_name(self) -> str:
        """The node this worker is in the pool: `pool_node`, else the host name."""
        return self.pool_node or socket.gethostname()
