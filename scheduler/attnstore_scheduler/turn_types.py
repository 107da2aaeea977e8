"""What a turn takes and produces, as the scheduler's own types: the worker's messages are
mapped once, in its client (worker_client.py), and the public API's once, at its edge
(servicer.py: the request's options in, the turn's events out)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class GenerationOptions:
    """How a request asks its answers to be drawn (the public API's GenerationOptions, an
    OpenAI request's body), before validation.sampling checks it and fills in defaults."""

    max_tokens: int = 0  # 0: the scheduler's default
    temperature: float | None = None  # None: greedy
    top_p: float | None = None  # None: no nucleus cut
    seed: int | None = None  # None: one the scheduler picks (sampled decoding)
    stop: tuple[str, ...] = ()
    n: int = 0  # 0: one answer


@dataclass(frozen=True)
class Token:
    token_id: int
    text: str  # what the token adds to the answer (may be "" mid-character)
    sample: int = 0  # which of the request's answers (GenerationOptions.n) it belongs to


class FinishReason(enum.StrEnum):
    """How an answer ended; the value is what a session record stores with the answer."""

    UNSPECIFIED = ""  # not reported (and every message that is not an answer)
    STOP = "stop"  # an end-of-turn or stop token
    STOP_STRING = "stop_string"  # the answer's text reached a stop text
    LENGTH = "length"  # max_tokens reached


@dataclass(frozen=True)
class SampleStats:
    """How one of a request's `n` answers ended."""

    generated_tokens: int
    finish_reason: FinishReason


@dataclass(frozen=True)
class WorkerStats:
    """What the worker that answered reported about the turn."""

    prompt_tokens: int  # after truncation
    reused_tokens: int  # loaded from the store instead of computed
    generated_tokens: int  # over all answers
    ttft_ms: float  # the worker's own time to first token
    truncated_tokens: int
    sink_tokens: int
    finish_reason: FinishReason  # of answer 0
    namespace: bytes  # of chunk_keys
    chunk_keys: tuple[bytes, ...]  # the conversation's saved full chunks, oldest first
    namespace_refused: str = ""  # why the KV store refused the tenant's namespace ("" if it did not)
    samples: tuple[SampleStats, ...] = ()  # each answer's, in order (one per answer)
    module_tokens: int = 0  # PML prompts: reused tokens that came from prompt modules
    repaired_tokens: int = 0  # PML prompts: module tokens recomputed by boundary repair
    encoded_modules: int = 0  # PML prompts: modules the worker encoded for this turn
    restore_plan: str = ""  # how a history stored as hidden states was restored ("" for KV or none)
    restore_ms: tuple[float, float, float] = (0.0, 0.0, 0.0)  # its recompute, hidden, kv milliseconds
    prompt_token_ids: tuple[int, ...] = ()  # PML prompts: the prompt as served, in position order


@dataclass(frozen=True)
class TurnOutcome:
    """The last event of a turn."""

    stats: WorkerStats
    prompt_token_ids: tuple[int, ...] | None  # the prompt the worker ran; None: it got messages (Generate)
    token_ids: tuple[int, ...]  # of answer 0 (the only one of a session's turn)
    text: str  # of answer 0
    node: str
    attempts: int
    queue_wait_seconds: float
    session_saved: bool = False  # Chat: the turn was stored in its session (set by Turns)
    closing_tokens: int = 0  # Chat: the template's closing the session's history adds after the answer
