"""What a worker lends to other workers' long contexts (WorkerSettings.micro_attention)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class MicroAttentionLimits(BaseModel):
    max_held_bytes: int = Field(
        1 << 30, ge=0, description="KV bytes this worker keeps for other workers' sequences; 0 = lends none"
    )
    max_query_tokens: int = Field(
        4096, ge=1, description="query tokens of one PartialAttention call (a prefill chunk at most)"
    )
    max_inflight_key_tokens: int = Field(
        1 << 22,
        ge=1,
        description="key tokens attended at once for others (the compute lent, Infinite-LLM's SLA "
        "threshold): a call beyond it gets RESOURCE_EXHAUSTED and its caller pulls the KV instead",
    )
    segment_idle_ttl_seconds: float = Field(
        600.0,
        gt=0,
        description="a segment no call touched for this long is dropped (its home worker died or forgot "
        "to release it): lent memory never stays pinned by a dead borrower",
    )
    max_segment_id_chars: int = Field(
        256, ge=1, description="longest segment id a caller may name (homes name theirs ~40 characters)"
    )
    read_piece_tokens: int = Field(
        1024, ge=1, description="tokens per ReadKV piece when the caller leaves it to us"
    )
