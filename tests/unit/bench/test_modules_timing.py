"""The prompt-module benchmark's TTFT timing: the full prefill and the module turn are taken
in turns after a warm-up of each, the order flipping each round, each run with its TTFT (the
turn's own) and the process's CPU over the turn; the summary's cores a module turn kept busy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from bench.modules.measure import CaseResult, Turn, alternated_runs
from bench.modules.report import summarize
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


def test_the_summary_reads_the_cores_a_module_turn_kept_busy() -> None:
    def row(label: str, ttft_ms: float, cpu_ms: float | None) -> CaseResult:
        return CaseResult(
            workload="doc_qa",
            label=label,
            module_tokens=900,
            prompt_tokens=930,
            ttft_full_ms=1500.0,
            ttft_modules_ms=ttft_ms,
            ppl_full=10.0,
            ppl_modules=10.0,
            agree_no_repair=1.0,
            ppl_modules_compact=10.0,
            reference_tokens=32,
            cpu_modules_ms=cpu_ms,
        )

    rows = [row("q0", 100.0, 120.0), row("q1", 80.0, 160.0), row("q2", 50.0, 50.0)]
    assert summarize(rows)["module_turn_cores_doc_qa"] == pytest.approx(1.2)
    assert summarize([row("q0", 100.0, None)])["module_turn_cores_doc_qa"] is None  # an older run's rows
