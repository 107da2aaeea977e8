"""Worker settings (environment variables `ATTNSTORE_WORKER_*`, or a TOML file named by
`ATTNSTORE_WORKER_CONFIG_FILE`). Each default is written here once. The context settings are
checked against the model at start (truncation.ContextWindow)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from attnstore.security import ChannelSecurity, check_server_security
from attnstore.server.ports import WORKER_PORT
from attnstore.server.service_settings import InternalAuthSetting, ListenAddress, ServiceSettings
from inference_worker.chat_template import DEFAULT_SPECIAL_TOKENS_IN_MESSAGES, SpecialTokensInMessages
from inference_worker.cpu_linear import CpuLinear
from inference_worker.dist_attention.limits import MicroAttentionLimits
from inference_worker.dist_attention.long_settings import LongContextSettings
from inference_worker.engine.model_runner import DEFAULT_LAYER_TIMEOUT_SECONDS
from inference_worker.model_store import DEFAULT_CACHE_DIR, DEFAULT_CPU_LINEAR
from inference_worker.restore.settings import RestoreSettings
from inference_worker.truncation import DEFAULT_SINK_TOKENS


class WorkerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="ATTNSTORE_WORKER_", extra="forbid")

    listen_address: ListenAddress = f"127.0.0.1:{WORKER_PORT}"
    micro_attention: MicroAttentionLimits = Field(
        default_factory=MicroAttentionLimits,
        description="KV held and attention computed for other workers' long contexts (DistAttention)",
    )
    long_context: LongContextSettings = Field(
        default_factory=LongContextSettings,
        description="turns whose KV does not fit the pool: their oldest KV on peer workers (DistAttention)",
    )
    internal_auth: InternalAuthSetting

    model_dir: Path | None = Field(
        None,
        description="local Hugging Face model directory; unset = SmolLM2-135M-Instruct, converted once "
        "into model_cache_dir",
    )
    model_cache_dir: Path = Field(
        DEFAULT_CACHE_DIR, description="where the default model's conversion is kept"
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="element type of weights and KV")
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="auto (cuda when available, else cpu), cpu, cuda[:N]",
    )
    cpu_linear: CpuLinear = Field(
        DEFAULT_CPU_LINEAR,
        description="kernel of the linear layers on a CPU: onednn (2.4x torch's default fp32 GEMM on the "
        "AMD development machine; torch's default where oneDNN is missing) or torch",
    )
    openmp_spin_count: int | None = Field(
        None,
        ge=0,
        description="polls the worker's OpenMP threads spin after each parallel region before they sleep "
        "(GOMP_SPINCOUNT; none = they sleep at once): for cores the worker has alone. Read from the "
        "environment only, before torch loads (openmp_waiting.py)",
    )
    openmp_pin_threads: bool = Field(
        False,
        description="bind the worker's OpenMP threads one per core (OMP_PROC_BIND=close, OMP_PLACES=cores), "
        "as vLLM's CPU engine does: for cores the worker has alone. Read from the environment only, before "
        "torch loads (openmp_waiting.py)",
    )

    kvstore_address: str | None = Field(
        None, description="host:port of the node's KV-store daemon; unset = no cache"
    )
    kvstore_use_shm: bool = Field(
        True, description="move chunk bytes through the daemon's shared memory when it can"
    )
    kvstore_shm_dir: Path | None = Field(
        None, description="the daemon's arena directory as mounted here; unset = the path the daemon reports"
    )
    kvstore_channel: ChannelSecurity = Field(
        default_factory=ChannelSecurity, description="TLS and internal token of the calls to the daemon"
    )
    chunk_tokens: int = Field(256, ge=1, le=65536, description="tokens per KV chunk")
    max_context_tokens: int | None = Field(
        None,
        ge=2,
        description="context window a turn's truncated prompt plus generated tokens fit in; "
        "unset = the model's max_position_embeddings (a larger value is refused at start)",
    )
    attention_sink_tokens: int = Field(
        DEFAULT_SINK_TOKENS,
        ge=0,
        description="first tokens a truncated prompt keeps as attention sinks; 0 = none; at most chunk_tokens",
    )
    block_tokens: int = Field(
        16, ge=1, le=65536, description="tokens per block of the worker's KV pool; must divide chunk_tokens"
    )
    kv_memory_bytes: int | None = Field(
        None, ge=1, description="bytes of the worker's KV pool; unset = kv_memory_fraction of the free memory"
    )
    kv_memory_fraction: float = Field(
        0.25,
        gt=0,
        le=0.95,
        description="share of the device's free memory (CPU: available RAM) after loading the model that "
        "the KV pool takes when kv_memory_bytes is unset",
    )
    max_batch_tokens: int = Field(
        2048, ge=1, description="most tokens one forward pass runs: decodes first, then prefill chunks"
    )
    max_batch_sequences: int = Field(64, ge=1, description="most sequences one forward pass runs")
    pool_keeps_freed_prefixes: bool = Field(
        False,
        description="keep a finished turn's blocks findable by later turns until they are reused (the pool "
        "as a cache level above the daemon); off, only live sequences share blocks",
    )
    layer_timeout_seconds: float = Field(
        DEFAULT_LAYER_TIMEOUT_SECONDS,
        gt=0,
        description="longest wait for one layer of loaded KV before recomputing",
    )
    lookup_timeout_seconds: float = Field(
        0.5, gt=0, description="longest wait for the daemon's Lookup before recomputing"
    )
    fetch_from_peers: bool = Field(
        True,
        description="read chunks the daemon placed on pool peers from those peers directly (their data "
        "plane); off, the daemon fetches them and serves them itself",
    )
    module_read_timeout_seconds: float = Field(
        5.0,
        gt=0,
        description="longest wait for the daemon's lookup of one prompt module's KV before encoding it "
        "again, and for a layer of its read that deviation repair selects with (the forward pass "
        "waits for a module's layer at most layer_timeout_seconds, then computes the module tokens)",
    )
    # Compact by default: with gaps even a full recompute is off the full prefill (-4.3..+2.8%
    # perplexity on the bench's quick prompts) and repairing next to a gap can hurt (+14.9% vs
    # +1.7% compact, deviation 15%, personalization); deviation at 15%, compact vs schema:
    # 3.78% vs 6.53% (the paper's schemas, full size), 2.92% vs 3.06% (document QA).
    module_positions: Literal["schema", "compact"] = Field(
        "compact",
        description="where a module prompt's parts are served: at their schema positions (Prompt Cache: "
        "omitted modules, short union members and short arguments leave gaps) or one after the other "
        "(compact: the positions of the same tokens prefilled whole; cached keys re-positioned)",
    )
    # Deviation by default: closer to the full prefill than first tokens on every set of
    # prompts measured (perplexity delta at a 15% budget: the paper's schemas at full size,
    # compact, 3.78% vs 5.24%; document QA, schema positions, 3.06% vs 3.67%; first wins on
    # code alone), for two layers of a full prefill more (docs/prompt-modules.md).
    module_repair_method: Literal["first", "deviation"] = Field(
        "deviation",
        description="which module tokens boundary repair recomputes (a module prompt's repair_tokens per "
        "module): the first of each module, or as many chosen by KV deviation (CacheBlend)",
    )

    # The model's dtype by default: exact (a module at position 0 gives the full prefill's
    # logits within 1e-4). bfloat16 halves the bytes a module turn reads and verifies (188 MB
    # of fp32 KV for a 4,096-token SmolLM2 module), at a perplexity cost measured in
    # docs/prompt-modules.md ("Store format").
    module_kv_dtype: Literal["model", "bfloat16", "float16"] = Field(
        "model",
        description="the format of prompt modules' KV in the store (converted to the model's dtype as it is "
        "read): the model's dtype (exact) or a narrower one (half the bytes for an fp32 model)",
    )

    # 256 MiB holds bench-modules' largest set in use at once: a 4,096-token SmolLM2 module
    # (188 MB fp32) or document QA's 8 documents (~190 MB). A 3-document prompt served from
    # here skips four daemon reads (docs/prompt-modules.md, "A document-QA turn taken apart").
    module_cache_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="bytes of prompt modules' KV the worker keeps in memory after reading it from the daemon, "
        "served instead of read again while the daemon still stores it (least recently used out; 0: off)",
    )

    # The prompt is a session's whole conversation (truncated to the context window by the
    # worker), so this bounds the request, not the context: 131072 ids are ~640 KB on the wire.
    max_prompt_tokens: int = Field(
        131072, ge=1, description="longest prompt accepted: a session's whole, untruncated conversation"
    )
    max_new_tokens: int = Field(
        2048,
        ge=1,
        description="largest max_tokens a turn may ask for (also capped so that every prompt fits "
        "once truncated: context - attention_sink_tokens - chunk_tokens)",
    )
    max_samples: int = Field(
        16, ge=1, description="largest n (parallel samples of one prompt) a turn may ask for"
    )
    max_message_chars: int = Field(200_000, ge=1, description="longest chat message accepted, in characters")
    max_messages: int = Field(1024, ge=1, description="most chat messages in one request")
    special_tokens_in_messages: SpecialTokensInMessages = Field(
        DEFAULT_SPECIAL_TOKENS_IN_MESSAGES,
        description="a message content that spells a control token (<|im_end|>): text = tokenize it as "
        "plain text, refuse = INVALID_ARGUMENT; never parsed as the control token (chat_template.py)",
    )

    health_check_interval_seconds: float = Field(
        10.0, ge=0, description="period of the health check's tiny tensor op on the device; 0 = only at start"
    )
    health_check_timeout_seconds: float = Field(
        5.0, gt=0, description="a device op slower than this fails the health check"
    )
    shutdown_grace_seconds: float = Field(
        30.0, ge=0, description="on SIGTERM, in-flight turns get this long, then pending KV saves as long"
    )

    restore: RestoreSettings = Field(
        default_factory=RestoreSettings,
        description="storing hidden states instead of KV (HCache, docs/hidden-states.md); by default only for "
        "multi-head-attention models (e.g. ATTNSTORE_WORKER_RESTORE__HIDDEN_STATES=off)",
    )

    @model_validator(mode="after")
    def _check_consistency(self) -> WorkerSettings:
        if self.kvstore_address is None and self.kvstore_shm_dir is not None:
            raise ValueError("kvstore_shm_dir needs kvstore_address")
        if self.kvstore_address is None and self.long_context.advertise_kvstore_address:
            raise ValueError(
                "long_context.advertise_kvstore_address needs kvstore_address (its daemon attaches)"
            )
        if self.chunk_tokens % self.block_tokens:
            raise ValueError(
                f"block_tokens ({self.block_tokens}) must divide chunk_tokens ({self.chunk_tokens}): a "
                "daemon chunk is then whole pool blocks"
            )
        check_server_security(self.tls, self.internal_auth)
        secure = self.tls.enabled or self.internal_auth.enabled
        if (
            (
                self.long_context.peers
                or self.long_context.peers_from_scheduler
                or self.long_context.pool_redis_url
            )
            and secure
            and not self.long_context.peer_channel.tls
        ):
            raise ValueError(
                "the peers of a worker with tls or internal_auth need long_context.peer_channel.tls to be called"
            )
        return self
