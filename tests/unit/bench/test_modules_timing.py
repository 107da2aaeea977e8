"""The prompt-module benchmark's TTFT timing: the full prefill and the module turn are taken
in turns after a warm-up of each, the order flipping each round, and each side's number is
the median of its own timed runs (warm-ups left out)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from bench.modules.measure import Turn, alternated_ttfts
from inference_worker.turn_types import TokenEvent, TurnStats


def recorded(name: str, ttfts: list[float], order: list[str]) -> Turn:
    """A turn whose runs report `ttfts` in order, each run noted in `order`."""
    runs = iter(ttfts)

    async def turn() -> AsyncIterator[TokenEvent | TurnStats]:
        order.append(name)
        yield TokenEvent(1, "")
        yield TurnStats(1, 0, 0, 0, 1, next(runs), 0.0, 0.0, 0.0, 0)

    return turn


def test_alternated_ttfts_take_turns_and_drop_the_warm_ups() -> None:
    order: list[str] = []
    full = recorded("full", [9.0, 5.0, 1.0, 4.0, 3.0, 2.0], order)
    modules = recorded("modules", [9.0, 0.5, 0.1, 0.4, 0.3, 0.2], order)
    assert asyncio.run(alternated_ttfts(full, modules, 5)) == (3.0, 0.3)
    turns = ["full", "modules"] * 6
    turns[4:6], turns[8:10] = ["modules", "full"], ["modules", "full"]  # rounds 1 and 3: modules first
    assert order == turns
