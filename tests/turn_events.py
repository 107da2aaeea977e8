"""What the worker's turn tests share (tests/ is on sys.path through the root conftest):
seeded random prompts and one turn's streamed events gathered and checked."""

from __future__ import annotations

from collections.abc import AsyncIterator

import torch

from inference_worker.turn_types import TokenEvent, TurnStats


def random_tokens(count: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


async def collect_turn(events: AsyncIterator[TokenEvent | TurnStats]) -> tuple[list[int], TurnStats]:
    """The token ids a turn streamed and its stats: tokens first, then exactly one stats."""
    tokens: list[int] = []
    stats: list[TurnStats] = []
    async for event in events:
        if isinstance(event, TokenEvent):
            assert not stats, "a token after the stats"
            tokens.append(event.token_id)
        else:
            stats.append(event)
    assert len(stats) == 1
    return tokens, stats[0]
