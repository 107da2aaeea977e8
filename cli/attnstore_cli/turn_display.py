"""How a turn's stats read in a terminal (shared by `chat` and `demo`)."""

from __future__ import annotations

from attnstore.api.v1 import api_pb2 as api


def reuse_summary(stats: api.TurnStats) -> str:
    """e.g. 'TTFT 84 ms (worker 61 ms) · reused 512 of 700 prompt tokens (73%)'."""
    share = stats.reused_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
    parts = [
        f"TTFT {stats.ttft_ms:.0f} ms (worker {stats.worker_ttft_ms:.0f} ms)",
        f"reused {stats.reused_tokens} of {stats.prompt_tokens} prompt tokens ({share:.0%})",
        f"{stats.generated_tokens} generated",
    ]
    if stats.truncated_tokens:
        parts.append(f"{stats.truncated_tokens} oldest tokens truncated")
    if stats.attempts > 1:
        parts.append(f"{stats.attempts} attempts")
    return " · ".join(parts)
