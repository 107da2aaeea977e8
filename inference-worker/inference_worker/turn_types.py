"""What a turn takes and gives back: the contract between the turn engine and the
worker's gRPC edge (and the scheduler, through proto/attnstore/worker/v1)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None  # sampled decoding is reproducible with a seed
    stop_token_ids: tuple[int, ...] = ()  # on top of the model's own end-of-turn tokens
    stop_strings: tuple[str, ...] = ()  # the turn ends once the answer's text contains one
    n: int = 1  # parallel samples of the prompt (sample i seeded with seed + i)


@dataclass(frozen=True)
class KVSource:
    """Where the prompt's reusable KV lives: the namespace of this model (and tenant)
    on the node's daemon."""

    namespace: bytes
    chunk_tokens: int
    dtype: str = ""  # its chunks' dtype, registered with the daemon ("": the model's)


@dataclass(frozen=True)
class TurnInput:
    prompt_token_ids: list[int]  # the whole untruncated conversation, chat template applied
    sampling: SamplingParams = SamplingParams()
    # The session's truncation so far: the least the turn drops after its attention sinks
    # (it drops more when the prompt and max_tokens do not fit). Truncation never shrinks
    # within a session, so the KV the next turn reuses is the KV this one computed.
    truncated_tokens: int = 0
    save_generated: bool = True  # save the KV of generated tokens too (next turn's history)
    # Leading prompt tokens the session's earlier turns ran; their partial last chunk may be
    # stored (saved by the previous turn). 0 = none.
    history_tokens: int = 0
    # Workers that may hold the oldest KV of a turn longer than the KV pool, beside
    # long_context.peers (the scheduler's; checked by LongTurns.check_peers).
    long_context_peers: tuple[str, ...] = ()


class Fallback(Enum):
    """Why a turn recomputed instead of reusing stored KV (None when it did not)."""

    DAEMON_UNAVAILABLE = "daemon_unavailable"
    DEADLINE = "deadline"
    CHUNK_INVALID = "chunk_invalid"


@dataclass(frozen=True)
class SampleStats:
    """How one of a turn's `n` samples ended."""

    generated_tokens: int
    finish_reason: str  # as TurnStats.finish_reason


@dataclass(frozen=True)
class TurnStats:
    prompt_tokens: int  # the untruncated prompt
    reused_tokens: int  # kept prompt tokens whose KV came from the store
    reused_dram_chunks: int
    reused_ssd_chunks: int
    generated_tokens: int  # over all samples
    ttft_seconds: float  # request start to first token
    kv_load_seconds: float  # loading the reused KV (mostly hidden behind compute)
    kv_load_exposed_seconds: float  # the part the forward pass actually waited for
    compute_seconds: float  # prefill of the new tokens
    saved_chunks: int  # new full chunks handed to the daemon (asynchronously)
    fallback: Fallback | None = None
    finish_reason: str = "stop"  # of sample 0: "stop" (end-of-turn or stop token), "stop_string" or "length"
    truncated_tokens: int = 0  # tokens dropped after the sinks (the next turn's request)
    sink_tokens: int = 0  # first tokens kept as attention sinks (0 when nothing was dropped)
    namespace: bytes = b""  # the KV namespace the turn used (b"" without a source)
    # Chain keys (over the untruncated tokens) of every full chunk of the prompt plus the
    # saved generated tokens, in order; dropped chunks included.
    chunk_keys: tuple[bytes, ...] = ()
    namespace_refused: str = ""  # the daemon's reason for refusing the namespace ("" if registered)
    samples: tuple[SampleStats, ...] = ()  # each sample's, in sample order
    # The restore plan of a prefix stored as hidden states (RestorePlan.name, e.g. "r1h1k1":
    # layers recomputed, projected from hidden states, loaded as KV); "" for a KV load or none.
    restore_plan: str = ""
    # Its seconds by method ("recompute", "hidden": compute; "kv": reads), RestoreStats.seconds.
    restore_seconds: Mapping[str, float] = field(default_factory=dict)
    # -- prompt modules (ModuleTurnInput) --
    module_tokens: int = 0  # prompt tokens whose KV came from module KV (stored or encoded apart)
    repaired_tokens: int = 0  # module tokens recomputed by boundary repair
    encoded_modules: int = 0  # modules (or scaffolds) encoded for this turn: first use, or evicted
    prompt_token_ids: tuple[int, ...] = ()  # the prompt as served, in position order (gaps are no tokens)


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    text: str  # the text this token adds (incremental detokenization)
    sample: int = 0  # which of the turn's samples (SamplingParams.n) it belongs to


@dataclass(frozen=True)
class ModuleTurnInput:
    """A one-off prompt written in PML against a schema (Prompt Cache)."""

    schema: str  # the schema document the prompt imports from
    prompt: str  # the <prompt> document
    sampling: SamplingParams = SamplingParams()
    _: KW_ONLY  # options by name: a field added among them must not shift another's value
    repair_tokens: int = 0  # per imported module, its first tokens recomputed (boundary repair)
    repair_fraction: float = 0.0  # else this share of each imported module's tokens (rounded up)
    # which tokens repair recomputes, "first" or "deviation" (repair_selection.py); None: the
    # worker's module_repair_method
    repair_method: str | None = None
    add_generation_prompt: bool = False  # end with the chat template's opening of the answer
