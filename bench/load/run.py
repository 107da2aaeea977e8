"""N concurrent sessions (64, then 256) of multi-turn chat through the
public API against the whole stack on loopback (stack.py: Redis, a daemon, two
workers on a small random-weight model, the scheduler), each for a bounded time after a
warm-up, a fresh stack per N.

The warm-up lasts until the KV store is full (its SSD tier has evicted: from then on it
holds as many chunks as it ever will) and at least --warmup-seconds, at most
--max-warmup-seconds; the measured window follows, --duration-seconds long.

Per N: throughput, client-side TTFT p50/p99 of all turns and of cached turns, failed
turns, hit rate (reused / prompt tokens), and the memory of every service sampled each
second (report.py defines growth after warm-up). Results: a table,
bench/results/load.json and load.png, PASS/FAIL per target (the exit code stays 0), and
the JSON summary as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop
from google.protobuf.json_format import MessageToDict

from attnstore.kvstore_client import AsyncKVStoreClient, KVStoreClient
from bench.common.machine import machine_info
from bench.common.results import RESULTS_DIR, save_results
from bench.load.driver import LoadConfig, LoadDriver
from bench.load.model import TINY_LLAMA, save_load_model
from bench.load.plot import plot_load
from bench.load.report import format_cpu, format_memory, format_table, summarize, summarize_run
from bench.load.sampler import ResourceSampler
from bench.load.stack import API_KEY, DAEMON_SETTINGS, SCHEDULER_SETTINGS, WORKER_SETTINGS, load_stack

MiB = 1024 * 1024
POLL_SECONDS = 1.0


async def store_filled(daemon_address: str) -> None:
    """Returns once the daemon's SSD tier has evicted a chunk."""
    async with AsyncKVStoreClient(daemon_address, use_shm=False) as kv:
        while not (await kv.stats()).ssd.evictions:
            await asyncio.sleep(POLL_SECONDS)


async def drive(
    driver: LoadDriver, daemon_address: str, clock: Callable[[], float], args: argparse.Namespace
) -> tuple[float, float, bool]:
    """Runs the load through the warm-up and the measured window; (end of warm-up,
    deadline, whether the store filled during the warm-up)."""
    load = asyncio.create_task(driver.run())
    try:
        await asyncio.wait_for(store_filled(daemon_address), args.max_warmup_seconds)
        filled = True
    except TimeoutError:
        filled = False
    await asyncio.sleep(max(0.0, args.warmup_seconds - clock()))
    warmup_end = clock()
    await asyncio.sleep(args.duration_seconds)
    deadline = clock()
    driver.stop()
    await load
    return warmup_end, deadline, filled


def run_one(sessions: int, model_dir: Path, args: argparse.Namespace, work_root: Path) -> tuple[dict, dict]:
    """One fresh stack, one load; (summary row, time series for the figure)."""
    stack = load_stack(
        Path(tempfile.mkdtemp(prefix=f"n{sessions}-", dir=work_root)),
        model_dir,
        daemon_settings={
            "dram_capacity_bytes": args.dram_mib * MiB,
            "ssd_capacity_bytes": args.ssd_mib * MiB,
        },
        scheduler_settings={"max_turns_per_worker": args.max_turns_per_worker},
    )
    stack.start()
    try:
        sampler = ResourceSampler(stack.pids()).start()
        config = LoadConfig(sessions, args.turns_per_session, args.max_tokens, args.think_seconds, args.seed)
        driver = LoadDriver(stack.address, API_KEY, config, sampler.now)
        print(
            f"N={sessions}: sessions in {stack.session_store}; warm-up until the store is full "
            f"({args.warmup_seconds:g} to {args.max_warmup_seconds:g} s), then {args.duration_seconds:g} s",
            file=sys.stderr,
            flush=True,
        )
        warmup_end, deadline, filled = uvloop.run(drive(driver, stack.daemon.address, sampler.now, args))
        samples = sampler.stop()
        with KVStoreClient(stack.daemon.address, use_shm=False) as kv:
            daemon_stats = MessageToDict(kv.stats(), preserving_proto_field_name=True)
    finally:
        exit_codes = stack.stop()
    window = (warmup_end, deadline)
    row = summarize_run(sessions, driver.turns, driver.failed_session_calls, samples, sampler.machine, window)
    row.update(
        session_store=stack.session_store,
        exit_codes=exit_codes,
        warmup_seconds=round(warmup_end, 1),
        store_full_after_warmup=filled,
        daemon_stats_at_end=daemon_stats,
    )
    memory: dict[str, list[tuple[float, float, float]]] = {}
    for sample in samples:
        memory.setdefault(sample.service, []).append(
            (round(sample.seconds, 2), sample.private_bytes / MiB, sample.rss_bytes / MiB)
        )
    turns = [
        (t.ended, t.ttft_ms, t.session_turn >= 2 and t.reused_tokens > 0)
        for t in driver.turns
        if t.error is None
    ]
    series = {
        "sessions": sessions,
        "warmup_end": warmup_end,
        "end": deadline,
        "memory": memory,
        "turns": turns,
    }
    return row, series


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sessions", type=int, nargs="+", default=[64, 256], help="concurrent sessions, one run each"
    )
    parser.add_argument("--warmup-seconds", type=float, default=20.0, help="the shortest warm-up")
    parser.add_argument(
        "--max-warmup-seconds", type=float, default=300.0, help="the longest, if the store never fills"
    )
    parser.add_argument(
        "--duration-seconds", type=float, default=60.0, help="measured time per run, after warm-up"
    )
    parser.add_argument("--turns-per-session", type=int, default=6, help="turns before a session is deleted")
    parser.add_argument("--max-tokens", type=int, default=8, help="max_tokens of every turn")
    parser.add_argument("--think-seconds", type=float, default=0.0, help="pause between a session's turns")
    parser.add_argument("--max-turns-per-worker", type=int, default=4, help="the scheduler's setting")
    parser.add_argument("--dram-mib", type=int, default=32, help="the daemon's DRAM tier")
    parser.add_argument("--ssd-mib", type=int, default=48, help="the daemon's SSD tier")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # One torch thread per worker: two workers on two cores, rather than four threads fighting.
    os.environ["OMP_NUM_THREADS"] = "1"
    started, load_before = time.monotonic(), os.getloadavg()
    work_root = Path(tempfile.mkdtemp(prefix="attnstore-bench-load-"))
    model_dir = save_load_model(work_root / "model", seed=args.seed)
    results = [run_one(n, model_dir, args, work_root) for n in args.sessions]
    if any(row["failed_turns"] for row, _ in results):
        print(f"failed turns: the services' logs are kept in {work_root}", file=sys.stderr)
    else:
        shutil.rmtree(work_root, ignore_errors=True)
    machine = machine_info(Path(tempfile.gettempdir()), packages=("torch", "transformers", "psutil"))
    machine["loadavg_1_5_15min"] = {"before": load_before, "after": os.getloadavg()}
    write_results(
        [row for row, _ in results],
        [series for _, series in results],
        machine,
        args,
        time.monotonic() - started,
    )


def write_results(
    runs: list[dict[str, Any]],
    series: list[dict],
    machine: dict[str, Any],
    args: argparse.Namespace,
    seconds: float,
) -> None:
    summary, verdicts = summarize(runs)
    config = {
        **vars(args),
        "model": {
            "kind": "random-weight Llama, SmolLM2-135M-Instruct tokenizer and chat template",
            **TINY_LLAMA,
        },
        "daemon_settings": DAEMON_SETTINGS,
        "worker_settings": WORKER_SETTINGS,
        "scheduler_settings": {**SCHEDULER_SETTINGS, "max_turns_per_worker": args.max_turns_per_worker},
        "ttft": "client side: from sending Chat to the first streamed token (queueing included)",
        "cached_turn": "a session's turn 2 or later that reused KV (reused_tokens > 0)",
        "hit_rate": "reused / prompt tokens over the measured turns",
        "memory_growth": "median of the last quarter of the measured window over the median of its first "
        "tenth, minus 1; private = RSS minus shared and file-backed pages",
    }
    document = {
        "summary": summary,
        "machine": machine,
        "config": config,
        "results": runs,
        "run_seconds": round(seconds, 1),
    }
    save_results("load", document)
    title = (
        f"attnstore under load: N concurrent multi-turn chat sessions on loopback ({machine['cpu_model']}, "
        f"{machine['cpu_cores_usable']} cores)\n2 workers on a random-weight 4-layer Llama, "
        f"sessions in {runs[0]['session_store']}, {args.max_tokens} new tokens per turn"
    )
    plot_load(series, title, RESULTS_DIR / "load.png")
    head = (
        f"machine: {machine['cpu_model']}, {machine['cpu_cores_usable']} cores; run took {seconds:.0f} s; "
        f"sessions in {runs[0]['session_store']}"
    )
    print("\n\n".join([head, format_table(runs), format_memory(runs), format_cpu(runs), "\n".join(verdicts)]))
    print(json.dumps(summary))  # last: the summary line
