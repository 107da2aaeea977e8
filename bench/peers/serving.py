"""Serving vs serving: vLLM (CPU, prefix caching) and attnstore serving SmolLM2-135M-Instruct
(fp32, the same converted weights) on the same ShareGPT conversations in the same
round-robin order, one turn at a time, each with the same greedy max_tokens.

Two phases, each on its own conversations:
  fits           a few conversations whose whole history fits in vLLM's KV space
  over capacity  more live conversations than vLLM's KV space holds: its prefix cache
                 evicts a conversation's blocks before its next turn comes, while
                 attnstore's daemon (the same DRAM bytes, plus its SSD tier) keeps them

Both systems are up for the whole run and take turns: every turn goes to both, one right
after the other (which one first alternates), so a burst of other load on this shared
machine hits both sides of a pair, not one side's whole phase. Neither side's leftover
work is billed to the other: after an attnstore turn the next request waits until the
daemon is quiet (its background saves landed), and every request waits until both
systems' processes are idle (bench/common/cpu_quiet.py: vLLM's worker spins on a core for a second
after each step). Per turn: the client's TTFT, the prompt tokens and that idle wait; per
phase: vLLM's prefix-cache hit rate (its /metrics) and the daemon's counters.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from tqdm import tqdm

from attnstore.api_client import AsyncAttnStoreClient
from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore_cli.local_stack import LocalStack
from bench.common.cpu_quiet import wait_until_idle
from bench.peers.attnstore_stack import attnstore_stack, chat_turn, worker_threading
from bench.peers.install import PeerVenv
from bench.peers.report import ATTNSTORE, VLLM, Record
from bench.peers.vllm import VllmServer
from bench.peers.workload import Dialogue, Step, round_robin

WARMUP_MESSAGE = "Hello! Who are you?"  # one untimed turn per side first: first-request costs stay out
# Quiet = the same counters over QUIET_POLLS polls (a save starts right after the answer's last token).
QUIET_POLLS, QUIET_POLL_SECONDS, QUIET_TIMEOUT_SECONDS = 3, 0.05, 10.0


@dataclass(frozen=True)
class Phase:
    name: str
    dialogues: list[Dialogue]
    turns: int

    @property
    def steps(self) -> list[Step]:
        return round_robin(self.dialogues, self.turns)


@dataclass(frozen=True)
class ServingConfig:
    model_dir: Path
    kv_cache_bytes: int  # vLLM's KV space = the daemon's DRAM tier
    max_tokens: int
    max_model_len: int
    omp_threads_bind: str
    vllm_block_size: int  # tokens a vLLM KV block holds: its prefix cache hits whole blocks
    worker_openmp_spin_count: int | None = None  # the worker's `openmp_spin_count` (None: its default)
    worker_openmp_pin_threads: bool = False  # the worker's `openmp_pin_threads`


def _record(side: str, phase: Phase, step: Step, timing: Any) -> Record:
    record = {
        "side": side,
        "phase": phase.name,
        "dialogue": phase.dialogues[step.dialogue].id,
        "turn": step.turn,
        **asdict(timing),
    }
    record.pop("text", None)
    return record


class VllmSide:
    """vLLM's server and each conversation's messages (its own answers included)."""

    def __init__(self, server: VllmServer, max_tokens: int) -> None:
        self.server, self.max_tokens = server, max_tokens
        self.history: dict[str, list[dict[str, str]]] = {}
        self.counters: dict[str, dict[str, float]] = {}  # prefix-cache counters per phase

    def warm_up(self) -> None:
        self.server.chat([{"role": "user", "content": WARMUP_MESSAGE}], self.max_tokens)

    def begin(self, phase: Phase) -> None:
        self.counters[phase.name] = self.server.prefix_cache_counters()

    def turn(self, phase: Phase, step: Step) -> Record:
        dialogue = phase.dialogues[step.dialogue]
        messages = [
            *self.history.get(dialogue.id, []),
            {"role": "user", "content": dialogue.messages[step.turn - 1]},
        ]
        timing = self.server.chat(messages, self.max_tokens)
        self.history[dialogue.id] = [*messages, {"role": "assistant", "content": timing.text}]
        return _record(VLLM, phase, step, timing)

    def end(self, phase: Phase) -> None:
        before, after = self.counters[phase.name], self.server.prefix_cache_counters()
        self.counters[phase.name] = {name: after[name] - before.get(name, 0.0) for name in after}


class AttnstoreSide:
    """The public API client, one session per conversation, and the daemon's counters."""

    def __init__(self, client: AsyncAttnStoreClient, kvstore: AsyncKVStoreClient, max_tokens: int) -> None:
        self.client, self.kvstore, self.max_tokens = client, kvstore, max_tokens
        self.sessions: dict[str, str] = {}
        self.stats: dict[str, Any] = {}  # the daemon's Stats after each phase

    async def warm_up(self) -> None:
        await chat_turn(
            self.client, (await self.client.create_session()).session_id, WARMUP_MESSAGE, self.max_tokens
        )
        await self.wait_quiet()

    async def turn(self, phase: Phase, step: Step) -> Record:
        dialogue = phase.dialogues[step.dialogue]
        if dialogue.id not in self.sessions:
            self.sessions[dialogue.id] = (await self.client.create_session()).session_id
        timing = await chat_turn(
            self.client, self.sessions[dialogue.id], dialogue.messages[step.turn - 1], self.max_tokens
        )
        await self.wait_quiet()
        return _record(ATTNSTORE, phase, step, timing)

    async def wait_quiet(self) -> None:
        """Until no write is open and the tiers' chunk counts stop moving (the worker's
        asynchronous save and the SSD write-through are done), at most QUIET_TIMEOUT_SECONDS."""
        deadline, seen = time.monotonic() + QUIET_TIMEOUT_SECONDS, []
        while time.monotonic() < deadline:
            stats = await self.kvstore.stats()
            seen = [
                *seen[-(QUIET_POLLS - 1) :],
                (
                    stats.reservations,
                    stats.dram.chunks,
                    stats.ssd.chunks,
                    stats.dram.used_bytes,
                    stats.ssd.used_bytes,
                ),
            ]
            if len(seen) == QUIET_POLLS and seen[0][0] == 0 and len(set(seen)) == 1:
                return
            await asyncio.sleep(QUIET_POLL_SECONDS)

    async def end(self, phase: Phase) -> None:
        self.stats[phase.name] = MessageToDict(await self.kvstore.stats(), preserving_proto_field_name=True)


async def _run_pairs(
    phases: list[Phase], vllm: VllmSide | None, ours: AttnstoreSide, pids: list[int], progress: tqdm
) -> list[Record]:
    """`pids`: both systems' processes, idle before every timed request."""
    records: list[Record] = []
    await ours.warm_up()
    if vllm is not None:
        await asyncio.to_thread(vllm.warm_up)
    for phase in phases:
        if vllm is not None:
            await asyncio.to_thread(vllm.begin, phase)
        for index, step in enumerate(phase.steps):
            pair: list[Record] = []
            for side in (VLLM, ATTNSTORE) if index % 2 == 0 else (ATTNSTORE, VLLM):
                if side == VLLM and vllm is None:
                    continue
                waited = await asyncio.to_thread(wait_until_idle, pids)
                if side == ATTNSTORE:
                    pair.append(await ours.turn(phase, step))
                else:
                    assert vllm is not None
                    pair.append(await asyncio.to_thread(vllm.turn, phase, step))
                pair[-1]["idle_wait_ms"] = waited * 1000
            records += pair
            progress.set_postfix_str(
                f"{phase.name} turn {step.turn}: "
                + ", ".join(f"{r['side']} {r['ttft_ms']:.0f} ms" for r in pair)
            )
            progress.update()
        if vllm is not None:
            await asyncio.to_thread(vllm.end, phase)
        await ours.end(phase)
    return records


async def _serve(
    stack: LocalStack, vllm: VllmSide | None, phases: list[Phase], max_tokens: int, progress: tqdm
) -> tuple[list[Record], dict[str, Any]]:
    async with (
        AsyncAttnStoreClient(stack.address, timeout_seconds=600) as client,
        AsyncKVStoreClient(stack.daemon.address, use_shm=False) as kvstore,
    ):
        ours = AttnstoreSide(client, kvstore, max_tokens)
        pids = list(stack.pids().values()) + (
            [vllm.server.pid] if vllm is not None and vllm.server.pid is not None else []
        )
        records = await _run_pairs(phases, vllm, ours, pids, progress)
    return records, {"daemon_stats_after_phase": ours.stats}


def run_serving(peer: PeerVenv, phases: list[Phase], config: ServingConfig, work_dir: Path) -> dict[str, Any]:
    """Both sides over every phase; {records, vllm, attnstore, unavailable}."""
    outcome: dict[str, Any] = {
        "records": [],
        "vllm": {},
        "unavailable": None if peer.available else peer.reason,
    }
    server = (
        VllmServer(
            peer,
            config.model_dir,
            config.kv_cache_bytes,
            work_dir / "vllm.log",
            config.max_model_len,
            config.omp_threads_bind,
            config.vllm_block_size,
        )
        if peer.available
        else None
    )
    shutil.rmtree(work_dir / "attnstore", ignore_errors=True)
    worker = worker_threading(config.worker_openmp_spin_count, config.worker_openmp_pin_threads)
    stack = attnstore_stack(work_dir / "attnstore", config.model_dir, config.kv_cache_bytes, worker or None)
    start_seconds = 0.0
    with tqdm(
        total=sum(len(phase.steps) for phase in phases),
        desc="bench-peers serving",
        unit="turn pair",
        file=sys.stderr,
    ) as progress:
        try:
            if server is not None:
                progress.set_postfix_str("starting vLLM (about two minutes)")
                try:
                    server.start()
                    outcome["vllm"] = {
                        "start_seconds": round(server.start_seconds, 1),
                        "command": server.command(),
                    }
                except (RuntimeError, OSError) as exc:
                    outcome["unavailable"], server = str(exc), None
            progress.set_postfix_str("starting the attnstore stack")
            started = time.monotonic()
            stack.start()
            start_seconds = time.monotonic() - started
            vllm = VllmSide(server, config.max_tokens) if server is not None else None
            outcome["records"], outcome["attnstore"] = asyncio.run(
                _serve(stack, vllm, phases, config.max_tokens, progress)
            )
            if vllm is not None:
                outcome["vllm"]["prefix_cache"] = vllm.counters
        finally:
            outcome.setdefault("attnstore", {}).update(
                start_seconds=round(start_seconds, 1), exit_codes=stack.stop()
            )
            if server is not None:
                server.stop()
    return outcome
