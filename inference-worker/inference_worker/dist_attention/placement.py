"""Where a long context's KV goes: the newest tokens (and the room to decode) here, the
oldest on peers in segments, each on the peer with the most room left (Infinite-LLM's
placement: the blocks that move are the ones a sequence touches only through attention).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from attnstore.errors import ResourceExhausted


@dataclass(frozen=True)
class SegmentPlan:
    peer: str | None  # a peer worker's address; None = here
    start: int
    tokens: int


class ContextTooLong(ResourceExhausted):
    """The context does not fit here and on the peers together."""


def plan_segments(
    context_tokens: int,
    local_tokens: int,
    peer_room_tokens: Mapping[str, int],
    segment_tokens: int,
) -> list[SegmentPlan]:
    """Segments covering positions [0, context_tokens): the last `local_tokens` (at most)
    here, the rest in segments of at most `segment_tokens` on peers, oldest first. Raises
    ContextTooLong when the peers' room does not cover the rest."""
    remote = max(0, context_tokens - local_tokens)
    room = dict(peer_room_tokens)
    if remote > sum(room.values()):
        raise ContextTooLong(
            f"a context of {context_tokens} tokens needs {remote} tokens on peers beyond the {local_tokens} "
            f"held here; the peers have room for {sum(room.values())}"
        )
    plans, position = [], 0
    while position < remote:
        peer = max(room, key=lambda address: (room[address], address))
        tokens = min(segment_tokens, remote - position, room[peer])
        plans.append(SegmentPlan(peer, position, tokens))
        room[peer] -= tokens
        position += tokens
    plans.append(SegmentPlan(None, remote, context_tokens - remote))
    return plans
