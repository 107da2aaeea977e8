"""Where each turn's TTFT goes on bench-peers' attnstore stack (the serving comparison's
fits conversations, the same stack and settings, no vLLM): the client's TTFT, the
scheduler's and the worker's, the worker's split of its own (the lookup and what comes
before the engine, the prefill compute, the part of the KV load the forward waited for),
the gRPC hops around the worker, and the CPU each process spent from the request to the
first token. `python -m bench.peers.turn_split [--conversations 4 --turns 4]`.

Why: the serving comparison's later turns are to be no slower than vLLM's
(`later_turn_ttft_vs_vllm_fits`); this says whether a turn's time is the forward pass or
something serial around it (docs/inference-worker.md, "Later-turn TTFT pass"). The worker's
split comes from its own Prometheus histograms (their sums, read before and after each
turn); CPU from each process's user + system time (10 ms ticks). Under other load only the
CPU times and the shares mean much. Prints one JSON line per turn and a summary line (the
medians of later turns); writes no results file (a diagnosis, not a suite).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import time
import urllib.request
from typing import Any

import psutil

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AsyncAttnStoreClient
from attnstore.kvstore_client import AsyncKVStoreClient
from bench.common.cpu_quiet import wait_until_idle
from bench.common.results import work_dir
from bench.peers.attnstore_stack import add_worker_threading_args, attnstore_stack, worker_threading
from bench.peers.run import MiB, phases_for
from bench.peers.serving import AttnstoreSide, Phase
from inference_worker.model_store import default_model_dir

WORK_DIR = work_dir("peers-turn-split")
MAX_TOKENS = 16  # as the serving comparison
# The worker's histograms (metrics.py), by their sums: seconds over all turns so far.
HISTOGRAMS = {
    "worker_ttft": "attnstore_worker_ttft_seconds_sum",
    "compute": "attnstore_worker_prefill_compute_seconds_sum",
    "kv_load": "attnstore_worker_kv_load_seconds_sum",
    "kv_load_exposed": "attnstore_worker_kv_load_exposed_seconds_sum",
}


def histogram_sums(metrics_port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    values = dict(line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))
    return {name: float(values[metric]) for name, metric in HISTOGRAMS.items()}


def cpu_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: sum(process.cpu_times()[:2]) for name, process in processes.items()}


async def timed_turn(
    client: AsyncAttnStoreClient, session_id: str, message: str, processes: dict[str, psutil.Process]
) -> tuple[float, dict[str, float], api.TurnStats]:
    """(client TTFT in seconds, each process's CPU seconds to the first token, the stats)."""
    before, sent = cpu_seconds(processes), time.perf_counter()
    ttft, used = None, None
    async for event in client.stream_chat(session_id, message, max_tokens=MAX_TOKENS, temperature=0.0):
        if isinstance(event, api.TurnStats):
            assert ttft is not None and used is not None, "a turn streams its tokens before its stats"
            return ttft, used, event
        if ttft is None:
            ttft = time.perf_counter() - sent
            used = {name: seconds - before[name] for name, seconds in cpu_seconds(processes).items()}
    raise RuntimeError("the Chat stream ended without its stats")


async def split_turns(
    phase: Phase, address: str, daemon: str, metrics_port: int, pids: dict[str, int]
) -> list[dict[str, Any]]:
    processes = {name: psutil.Process(pid) for name, pid in pids.items()}
    rows: list[dict[str, Any]] = []
    async with (
        AsyncAttnStoreClient(address, timeout_seconds=600) as client,
        AsyncKVStoreClient(daemon, use_shm=False) as kvstore,
    ):
        side = AttnstoreSide(client, kvstore, MAX_TOKENS)  # its warm-up turn and quiet wait
        await side.warm_up()
        sessions: dict[str, str] = {}
        for step in phase.steps:
            dialogue = phase.dialogues[step.dialogue]
            if dialogue.id not in sessions:
                sessions[dialogue.id] = (await client.create_session()).session_id
            await asyncio.to_thread(wait_until_idle, list(pids.values()))
            sums = histogram_sums(metrics_port)
            ttft, used, stats = await timed_turn(
                client, sessions[dialogue.id], dialogue.messages[step.turn - 1], processes
            )
            await side.wait_quiet()  # the turn's stats are observed, its saves landed
            ms = {name: (after - sums[name]) * 1e3 for name, after in histogram_sums(metrics_port).items()}
            rows.append({
                "turn": step.turn, "prompt_tokens": stats.prompt_tokens, "reused_tokens": stats.reused_tokens,
                "client_ttft_ms": ttft * 1e3, "scheduler_ttft_ms": stats.ttft_ms, "worker_ttft_ms": ms["worker_ttft"],
                "before_engine_ms": ms["worker_ttft"] - ms["compute"] - ms["kv_load_exposed"],
                "compute_ms": ms["compute"], "kv_load_ms": ms["kv_load"], "kv_load_exposed_ms": ms["kv_load_exposed"],
                "hops_ms": ttft * 1e3 - ms["worker_ttft"],
                **{f"cpu_ms_{name.split()[0]}": seconds * 1e3 for name, seconds in used.items()},
            })  # fmt: skip
            print(json.dumps({key: round(value, 1) for key, value in rows[-1].items()}), flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4, help="the fits phase's (bench-peers: 4)")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="conversation order (bench-peers: 0)")
    add_worker_threading_args(parser)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    model_dir = default_model_dir()
    selection = argparse.Namespace(
        fits_conversations=args.conversations, over_conversations=0, turns=args.turns, seed=args.seed
    )
    phase = phases_for(selection, model_dir)[0]
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    threading = worker_threading(args.worker_openmp_spin_count, args.worker_openmp_pin_threads)
    stack = attnstore_stack(WORK_DIR, model_dir, 512 * MiB, worker_overrides={"metrics_port": 0, **threading})
    stack.start()
    try:
        assert stack.worker.metrics_port is not None
        rows = asyncio.run(
            split_turns(phase, stack.address, stack.daemon.address, stack.worker.metrics_port, stack.pids())
        )
    finally:
        stack.stop()
    later = [row for row in rows if row["turn"] > 1]
    summary: dict[str, Any] = {
        "later_turns": len(later),
        "median_ms": {key: round(statistics.median(row[key] for row in later), 1)
                      for key in later[0] if key.endswith("_ms")} if later else {},
        "loadavg_1_5_15min": {"before": load_before, "after": os.getloadavg()}, "worker_threading": threading,
    }  # fmt: skip
    print(json.dumps(summary))
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    return summary


if __name__ == "__main__":
    main()
