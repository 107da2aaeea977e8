"""bench-batch's serving part: three systems up at once on SmolLM2-135M-Instruct (fp32, the
same converted weights), the same dialogues at each concurrency level.

    attnstore          the local stack (daemon, worker, scheduler; bench-peers' settings),
                       the engine as configured by default (up to 64 sequences a step)
    attnstore batch-1  the same stack with the worker's max_batch_sequences = 1
    vllm               vLLM CPU (bench-peers' venv) with prefix caching, at its best for
                       this workload: --block-size 32, OpenMP on every usable core

Each level's sessions start together; the systems take turns level by level (which goes
first rotates), and before each cell every system's processes are idle (cpu_quiet.py), so
one system's leftover work (vLLM's worker spins a second after each step) is not billed to
the next. A short untimed warm-up level runs on each system first.
"""

from __future__ import annotations

import asyncio
import re
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnstore.server.ports import free_port
from attnstore_cli.local_stack import LocalStack
from attnstore_cli.stack_spec import StackSpec, WorkerSpec
from bench.batch.clients import attnstore_level, vllm_level
from bench.batch.report import BATCH1, ENGINE, SYSTEMS, VLLM
from bench.batch.stats import TurnRecord, summarize_level
from bench.common.cpu_quiet import wait_until_idle
from bench.peers.attnstore_stack import DAEMON_SETTINGS, NODE, SCHEDULER_SETTINGS, WORKER_SETTINGS
from bench.peers.install import PeerVenv
from bench.peers.serving import WARMUP_MESSAGE
from bench.peers.workload import Dialogue
from bench.vllm.run import BenchServer

WARMUP_SESSIONS = 4
# A turn's time includes its wait in the engine's queue: at batch 1 behind every other session.
TURN_TIMEOUT_SECONDS = 1800.0
_BATCH = re.compile(r"^attnstore_worker_batch_sequences_(sum|count) ([0-9.e+]+)$", re.MULTILINE)


@dataclass(frozen=True)
class ServingConfig:
    model_dir: Path
    kv_memory_bytes: int  # each worker's pool, each daemon's DRAM tier, vLLM's KV space
    levels: list[int]
    turns: int
    max_tokens: int
    vllm_block_size: int
    max_model_len: int
    omp_threads_bind: str
    worker_openmp_spin_count: int | None = None  # the worker's `openmp_spin_count` (None: its default)


def batch_stack(
    work_dir: Path, config: ServingConfig, metrics_port: int, *, max_batch_sequences: int | None
) -> LocalStack:
    """A stack whose worker runs at most `max_batch_sequences` a step (None: its default),
    and whose scheduler hands it every session of the largest level at once (the engine,
    not the scheduler, decides what runs together)."""
    worker = {**WORKER_SETTINGS, "kv_memory_bytes": config.kv_memory_bytes, "metrics_port": metrics_port}
    if max_batch_sequences is not None:
        worker["max_batch_sequences"] = max_batch_sequences
    if config.worker_openmp_spin_count is not None:
        worker["openmp_spin_count"] = config.worker_openmp_spin_count
    return LocalStack(
        StackSpec(
            work_dir=work_dir,
            model_dir=config.model_dir,
            workers=(WorkerSpec(NODE),),
            daemon_settings={**DAEMON_SETTINGS, "dram_capacity_bytes": config.kv_memory_bytes},
            worker_settings=worker,
            scheduler_settings={
                **SCHEDULER_SETTINGS,
                "max_turns_per_worker": max(config.levels),
                "turn_timeout_seconds": TURN_TIMEOUT_SECONDS,
            },
            log_level="WARNING",
        )
    )


class Systems:
    """The systems under test, started and stopped together; `level` runs one cell."""

    def __init__(self, peer: PeerVenv, config: ServingConfig, work_dir: Path) -> None:
        self.config = config
        self.metrics_ports = {ENGINE: free_port(), BATCH1: free_port()}
        self.stacks = {
            ENGINE: batch_stack(
                work_dir / "engine", config, self.metrics_ports[ENGINE], max_batch_sequences=None
            ),
            BATCH1: batch_stack(
                work_dir / "batch1", config, self.metrics_ports[BATCH1], max_batch_sequences=1
            ),
        }
        self.vllm = (
            BenchServer(
                peer,
                config.model_dir,
                config.kv_memory_bytes,
                work_dir / "vllm.log",
                config.max_model_len,
                config.omp_threads_bind,
                block_size=config.vllm_block_size,
                kv_transfer_config=None,
            )
            if peer.available
            else None
        )
        self.unavailable: str | None = None if peer.available else peer.reason

    @property
    def names(self) -> list[str]:
        return [name for name in SYSTEMS if name != VLLM or self.vllm is not None]

    def start(self) -> None:
        """vLLM compiles for minutes: it starts in the background while the stacks start."""
        with ThreadPoolExecutor(1) as pool:
            vllm = pool.submit(self.vllm.start) if self.vllm is not None else None
            for stack in self.stacks.values():
                stack.start()
            if vllm is not None:
                try:
                    vllm.result()
                except (RuntimeError, OSError) as exc:
                    self.unavailable, self.vllm = str(exc), None

    def stop(self) -> dict[str, Any]:
        codes = {name: stack.stop() for name, stack in self.stacks.items()}
        if self.vllm is not None:
            self.vllm.stop()
        return codes

    def pids(self) -> list[int]:
        pids = [pid for stack in self.stacks.values() for pid in stack.pids().values()]
        return pids + ([self.vllm.pid] if self.vllm is not None and self.vllm.pid is not None else [])

    def level(self, system: str, dialogues: list[Dialogue], turns: int) -> list[TurnRecord]:
        wait_until_idle(self.pids())
        if system == VLLM:
            assert self.vllm is not None
            return vllm_level(self.vllm, dialogues, turns, self.config.max_tokens)
        address = self.stacks[system].address
        return asyncio.run(attnstore_level(address, dialogues, turns, self.config.max_tokens))

    def batch_counters(self, system: str) -> tuple[float, float]:
        """The worker's engine so far: (sequences over all forward passes, forward passes),
        from its batch-size histogram (/metrics); (0, 0) for vLLM."""
        if system not in self.metrics_ports:
            return 0.0, 0.0
        url = f"http://127.0.0.1:{self.metrics_ports[system]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            values = dict(_BATCH.findall(response.read().decode()))
        return float(values.get("sum", 0.0)), float(values.get("count", 0.0))


def run_serving(
    peer: PeerVenv, config: ServingConfig, dialogues: dict[int, list[Dialogue]], work_dir: Path
) -> dict[str, Any]:
    """{cells: system -> level -> summary, records, vllm_unavailable (why, or None), exit_codes}."""
    systems = Systems(peer, config, work_dir)
    cells: dict[str, dict[int, dict[str, Any]]] = {}
    records: list[dict[str, Any]] = []
    try:
        systems.start()
        warmup = [Dialogue(f"warmup-{i}", [WARMUP_MESSAGE]) for i in range(WARMUP_SESSIONS)]
        for name in systems.names:
            systems.level(name, warmup, 1)
        for index, level in enumerate(config.levels):
            names = systems.names
            for name in names[index % len(names) :] + names[: index % len(names)]:
                before = systems.batch_counters(name)
                turns = systems.level(name, dialogues[level], config.turns)
                cells.setdefault(name, {})[level] = cell = summarize_level(turns)
                cell["mean_batch_sequences"] = mean_batch(before, systems.batch_counters(name))
                records += [_record(name, level, turn) for turn in turns]
                print(
                    f"{name} at {level} sessions: {cell['output_tokens_per_s']} output tokens/s, "
                    f"TTFT p50 {cell['ttft_p50_ms']} ms",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        exit_codes = systems.stop()
    return {
        "cells": {name: cells.get(name, {}) for name in systems.names},
        "records": records,
        "vllm_unavailable": systems.unavailable,
        "exit_codes": exit_codes,
    }


def mean_batch(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """Sequences per forward pass between two reads of the batch-size histogram."""
    passes = after[1] - before[1]
    return round((after[0] - before[0]) / passes, 2) if passes else None


def _record(system: str, level: int, turn: TurnRecord) -> dict[str, Any]:
    return {
        "system": system,
        "sessions": level,
        "session": turn.session,
        "turn": turn.turn,
        "ttft_ms": round(turn.ttft_s * 1000, 2),
        "total_ms": round((turn.ended - turn.started) * 1000, 2),
        "prompt_tokens": turn.prompt_tokens,
        "output_tokens": turn.output_tokens,
    }
