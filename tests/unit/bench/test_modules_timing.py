"""The prompt-module benchmark's TTFT timing: the full prefill and the module turn are taken
in turns after a warm-up of each, the order flipping each round, each run with its TTFT (the
turn's own) and the process's CPU over the turn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from bench.modules.measure import Turn, alternated_runs
from inference_worker.turn_types import TokenEvent, TurnStats


def recorded(name: str, ttfts: list[float], order: list[str], busy: float = 0.0) -> Turn:
    """A turn whose runs report `ttfts` in order, each run noted in `order`, spinning the CPU
    for `busy` seconds."""
    runs = iter(ttfts)

    async def turn() -> AsyncIterator[TokenEvent | TurnStats]:
        order.append(name)
        until = time.process_time() + busy
        while time.process_time() < until:
            pass
        yield TokenEvent(1, "")
        yield TurnStats(1, 0, 0, 0, 1, next(runs), 0.0, 0.0, 0.0, 0)

    return turn


def test_alternated_runs_take_turns_and_leave_out_the_warm_ups() -> None:
    order: list[str] = []
    full = recorded("full", [9.0, 5.0, 1.0, 4.0, 3.0, 2.0], order)
    modules = recorded("modules", [9.0, 0.5, 0.1, 0.4, 0.3, 0.2], order, busy=0.02)
    full_runs, module_runs = asyncio.run(alternated_runs(full, modules, 5))
    assert [run.ttft for run in full_runs] == [5.0, 1.0, 4.0, 3.0, 2.0]
    assert [run.ttft for run in module_runs] == [0.5, 0.1, 0.4, 0.3, 0.2]
    assert all(run.cpu >= 0.02 for run in module_runs)
    turns = ["full", "modules"] * 6
    turns[4:6], turns[8:10] = ["modules", "full"], ["modules", "full"]  # rounds 1 and 3: modules first
    assert order == turns
