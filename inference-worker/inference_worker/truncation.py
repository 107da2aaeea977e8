"""Context overflow, as AttentionStore truncates: when a conversation outgrows the context
window, a turn keeps its first tokens as attention sinks, drops the oldest whole chunks after
them and moves the rest back, so the stored KV of the kept chunks is reused at its new
positions (rotary_shift) instead of being recomputed.

Coordinates. The prompt is the whole untruncated conversation. Chunk j covers its tokens
[jC, (j+1)C) and is keyed by the chain from token 0 over those original tokens, truncated or
not, so a kept chunk is found under the key it was saved with. A truncation that resumes at
chunk k keeps tokens [0, S) at positions 0..S-1 and tokens [kC, n) from position S on: token
i >= kC sits at i - dropped, with dropped = kC - S.

    original  s s . . | . . . . | . . . . | x x x x | x x       S = 2, C = 4, k = 3
    kept      s s x x x x x x                                   dropped = 10

Decisions:
- Only whole chunks are dropped (besides the tail of chunk 0 behind the sinks), so every
  kept chunk is a stored chunk moved as a whole. The least number that makes the kept
  prompt plus max_tokens fit is dropped, and at least what the session already dropped
  (the request's truncated_tokens): truncation never shrinks, so the KV that the next
  turn reuses is the KV this turn computed beside the same sinks.
- The sinks are the first S tokens of chunk 0, so a truncated turn loads chunk 0 (and uses
  S of its tokens), then the kept chunks; S <= C.
- The chunk holding the last prompt token is never dropped. The worker cannot see where
  the newest message begins in a token prompt, so a new message longer than the window
  loses its oldest part, as token truncation would. A turn that cannot fit even then
  (max_tokens too large, or a truncated_tokens beyond what the prompt allows) is refused
  with INVALID_ARGUMENT; capping max_tokens at `ContextWindow.max_new_tokens` makes the
  former impossible through the gRPC edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnstore.errors import InvalidArgument

DEFAULT_SINK_TOKENS = 4  # StreamingLLM: four initial tokens recover the no-truncation perplexity


class ContextWindowError(ValueError):
    """The context settings do not suit the model or the chunk size; the message says why."""


@dataclass(frozen=True)
class Truncation:
    """What a turn keeps of its untruncated prompt (the default keeps everything)."""

    sink_tokens: int = 0  # S: leading tokens kept at positions 0..S-1 (0 when nothing is dropped)
    dropped_tokens: int = 0  # tokens [S, S + dropped) are gone; S + dropped is a multiple of C

    @property
    def resume_at(self) -> int:
        """The first original token kept after the sinks (kC)."""
        return self.sink_tokens + self.dropped_tokens

    def kept(self, tokens: Sequence[int]) -> list[int]:
        """The tokens a turn runs, in position order."""
        return list(tokens[: self.sink_tokens]) + list(tokens[self.resume_at :])

    def reusable_chunks(self, prompt_tokens: int, chunk_tokens: int) -> list[int]:
        """Original indices of the chunks whose stored KV a prompt may load, in kept order:
        chunk 0 for its sinks, then the kept chunks before the one holding the last prompt
        token (that token is always computed: its logits start the decoding)."""
        end = (prompt_tokens - 1) // chunk_tokens
        first_kept = self.resume_at // chunk_tokens
        return ([0] if self.sink_tokens else []) + list(range(first_kept, end))


NO_TRUNCATION = Truncation()


@dataclass(frozen=True)
class ContextWindow:
    """The worker's context settings, checked against each other."""

    max_context_tokens: int  # W: a turn's kept prompt plus generated tokens fit in it
    sink_tokens: int  # S: attention sinks kept through truncation
    chunk_tokens: int  # C

    def __post_init__(self) -> None:
        if not 0 <= self.sink_tokens <= self.chunk_tokens:
            raise ContextWindowError(
                f"attention_sink_tokens is {self.sink_tokens}; it must lie in [0, chunk_tokens = "
                f"{self.chunk_tokens}] (the sinks are the first tokens of the first chunk)"
            )
        if self.max_new_tokens < 1:
            raise ContextWindowError(
                f"max_context_tokens is {self.max_context_tokens}; it must exceed attention_sink_tokens "
                f"+ chunk_tokens = {self.sink_tokens + self.chunk_tokens}, or a prompt truncated to its "
                "sinks and its last chunk may leave no room to generate"
            )

    @classmethod
    def for_model(
        cls, model_positions: int, max_context_tokens: int | None, sink_tokens: int, chunk_tokens: int
    ) -> ContextWindow:
        """The window of a model with `model_positions` positions: all of them unless
        `max_context_tokens` asks for fewer."""
        if max_context_tokens is not None and max_context_tokens > model_positions:
            raise ContextWindowError(
                f"max_context_tokens is {max_context_tokens}, beyond the model's {model_positions} positions"
            )
        return cls(max_context_tokens or model_positions, sink_tokens, chunk_tokens)

    @property
    def max_new_tokens(self) -> int:
        """The largest max_tokens every prompt fits with: truncated to the utmost, a prompt
        keeps its sinks and at most one chunk."""
        return self.max_context_tokens - self.sink_tokens - self.chunk_tokens

    def plan(self, prompt_tokens: int, max_tokens: int, requested_tokens: int = 0) -> Truncation:
        """The least truncation that fits the prompt and max_tokens in the window and drops at
        least `requested_tokens` (the session's truncation so far); raises InvalidArgument
        when no truncation does."""
        overflow = prompt_tokens + max_tokens - self.max_context_tokens
        needed = max(requested_tokens, overflow)
        if needed <= 0:
            return NO_TRUNCATION
        sinks, chunk = self.sink_tokens, self.chunk_tokens
        first_kept = -(-(needed + sinks) // chunk)  # ceil: whole chunks only
        last_chunk = (prompt_tokens - 1) // chunk  # holds the last prompt token: never dropped
        if first_kept > last_chunk:
            if requested_tokens >= overflow:
                raise InvalidArgument(
                    f"truncated_tokens is {requested_tokens}, but a prompt of {prompt_tokens} tokens can "
                    f"drop at most {max(last_chunk * chunk - sinks, 0)} (it keeps {sinks} attention-sink "
                    f"tokens and the {chunk}-token chunk holding its last token)"
                )
            raise InvalidArgument(
                f"a prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} does not fit the "
                f"{self.max_context_tokens}-token context window, even truncated to its {sinks} "
                f"attention-sink tokens and its last {prompt_tokens - last_chunk * chunk} tokens; "
                f"lower max_tokens (at most {self.max_new_tokens} always fit)"
            )
        return Truncation(sink_tokens=sinks, dropped_tokens=first_kept * chunk - sinks)
