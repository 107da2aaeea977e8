"""attnstore side by side with LMCache and vLLM, each peer in its own
venv (install.py; installed on the first run, cached after), in one run.

  store vs store      our daemon vs LMCache's standalone server on the same chunks, same
                      concurrency, same harness (store.py)
  serving vs serving  vLLM (CPU, prefix caching) vs the attnstore stack on SmolLM2-135M fp32,
                      the same ShareGPT conversations in the same order, within and beyond
                      vLLM's KV space (serving.py)

Results: two tables, bench/results/peers.json, peers_store.png and peers_serving.png, the
targets as PASS/FAIL (the exit code stays 0), and the JSON summary as the last line. A
peer that cannot be installed or started is reported UNAVAILABLE with the reason; the
rest still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import transformers

from bench.common.machine import machine_info
from bench.common.results import RESULTS_DIR, save_results, work_dir
from bench.peers.attnstore_stack import add_worker_threading_args
from bench.peers.install import ensure_peer, peers_dir
from bench.peers.plot import plot_serving, plot_store
from bench.peers.report import (
    ATTNSTORE,
    FITS,
    OVER,
    add_lmcache_ratios,
    format_serving_table,
    format_store_table,
    serving_summary,
    store_summary,
    verdicts,
)
from bench.peers.serving import Phase, ServingConfig, run_serving
from bench.peers.store import run_store
from bench.peers.workload import select_dialogues
from inference_worker.model_store import default_model_dir

WORK_DIR = work_dir("peers")  # logs, the daemons' SSD directories; removed after a clean run
MiB = 1024 * 1024
# ShareGPT conversations: the first `turns` user messages, each <= 800 tokens, 900..2200 in all.
MESSAGE_LIMITS = {"min_tokens": 900, "max_tokens": 2200, "max_message_tokens": 800}


def usable_cores_bind() -> str:
    """The cores this process may use, as vLLM's bind list ("0-1" on the 2-core machine):
    detected, never assumed; "auto" (vLLM's own choice) when they are not one range."""
    cores = sorted(os.sched_getaffinity(0))
    return f"{cores[0]}-{cores[-1]}" if cores[-1] - cores[0] + 1 == len(cores) else "auto"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets and few turns: a smoke run")
    parser.add_argument(
        "--only",
        choices=("store", "serving"),
        help="run one comparison only; the other one is kept from the last results",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4], choices=[1, 4])
    parser.add_argument(
        "--kv-cache-mib",
        type=int,
        default=512,
        help="vLLM's KV space, and the daemon's DRAM tier (SmolLM2 fp32: 45 KiB per token)",
    )
    parser.add_argument("--fits-conversations", type=int, default=4)
    parser.add_argument("--over-conversations", type=int, default=20)
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens generated per turn, both sides")
    parser.add_argument(
        "--omp-threads-bind",
        default=usable_cores_bind(),
        help="vLLM's VLLM_CPU_OMP_THREADS_BIND (default: every core this process may use)",
    )
    parser.add_argument(
        "--vllm-block-size",
        type=int,
        default=32,
        help="vLLM's KV block (--block-size): 32, its best here; its default 128 recomputes "
        "up to 127 tokens of history a turn",
    )
    add_worker_threading_args(parser)
    parser.add_argument("--seed", type=int, default=0, help="conversation order")
    args = parser.parse_args(argv)
    if args.quick:
        args.fits_conversations, args.over_conversations, args.turns = 2, 3, 3
    return args


def phases_for(args: argparse.Namespace, model_dir: Path) -> list[Phase]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    total = args.fits_conversations + args.over_conversations
    dialogues = select_dialogues(tokenizer, count=total, turns=args.turns, seed=args.seed, **MESSAGE_LIMITS)
    return [
        Phase(FITS, dialogues[: args.fits_conversations], args.turns),
        Phase(OVER, dialogues[args.fits_conversations :], args.turns),
    ]


def run_store_part(args: argparse.Namespace, document: dict[str, Any]) -> None:
    lmcache = ensure_peer("lmcache")
    document["store"] = run_store(lmcache, args.concurrency, WORK_DIR, args.quick)
    document["peers"]["lmcache"] = {
        "version": lmcache.version,
        "unavailable": document["store"]["unavailable"],
    }


def run_serving_part(args: argparse.Namespace, document: dict[str, Any]) -> None:
    vllm = ensure_peer("vllm")
    model_dir = default_model_dir()  # converted once, before either side loads it
    phases = phases_for(args, model_dir)
    config = ServingConfig(
        model_dir,
        args.kv_cache_mib * MiB,
        args.max_tokens,
        8192,
        args.omp_threads_bind,
        args.vllm_block_size,
        args.worker_openmp_spin_count,
        args.worker_openmp_pin_threads,
    )
    serving = document["serving"] = run_serving(vllm, phases, config, WORK_DIR)
    document["peers"]["vllm"] = {"version": vllm.version, "unavailable": serving["unavailable"]}
    serving["config"] = {
        "model_dir": str(model_dir),
        "dtype": "float32",
        "kv_cache_bytes": config.kv_cache_bytes,
        "max_tokens": args.max_tokens,
        "turns": args.turns,
        "sampling": "greedy",
        "phases": {p.name: [d.id for d in p.dialogues] for p in phases},
        "message_limits": MESSAGE_LIMITS,
        "seed": args.seed,
        "vllm_omp_threads_bind": args.omp_threads_bind,
        "vllm_block_size": args.vllm_block_size,
        "worker_openmp_spin_count": args.worker_openmp_spin_count,
        "worker_openmp_pin_threads": args.worker_openmp_pin_threads,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started, load_before = time.monotonic(), os.getloadavg()  # other load on the machine skews the numbers
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    WORK_DIR.mkdir(parents=True)
    document = carried_over(args.only)
    try:
        if args.only != "serving":
            run_store_part(args, document)
        if args.only != "store":
            run_serving_part(args, document)
    except BaseException:
        print(f"logs are kept in {WORK_DIR}", file=sys.stderr)
        raise
    machine = machine_info(WORK_DIR, packages=("torch", "transformers"))
    machine["loadavg_1_5_15min"] = {"before": load_before, "after": os.getloadavg()}
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    write_results(document, machine, args, time.monotonic() - started)


def carried_over(only: str | None) -> dict[str, Any]:
    """A new results document; with `--only`, it keeps the other comparison (its section
    and its peer) from the last results file, marked with that run's date."""
    document: dict[str, Any] = {"peers": {}}
    previous_file = RESULTS_DIR / "peers.json"
    if only is None or not previous_file.exists():
        return document
    previous = json.loads(previous_file.read_text())
    other, peer = ("serving", "vllm") if only == "store" else ("store", "lmcache")
    if other in previous:
        document[other] = previous[other]
        document["peers"][peer] = previous["peers"][peer]
        when = previous.get("carried_over", {}).get(other) or previous.get("finished_at") or "an earlier run"
        document["carried_over"] = {other: when}
    return document


def write_results(
    document: dict[str, Any], machine: dict[str, Any], args: argparse.Namespace, seconds: float
) -> None:
    store, serving = document.get("store"), document.get("serving")
    summary: dict[str, Any] = {}
    if store:
        add_lmcache_ratios(store["rows"])
        summary.update(store_summary(store["rows"]))
    if serving:
        summary.update(serving_summary(serving["records"]))
        summary["vllm_prefix_cache_hit_rate"] = {
            phase: round(c["hits_total"] / c["queries_total"], 4) if c.get("queries_total") else None
            for phase, c in serving.get("vllm", {}).get("prefix_cache", {}).items()
        }
        summary["attnstore_reused_fraction"] = {
            phase: round(
                sum(r["reused_tokens"] for r in mine) / max(1, sum(r["prompt_tokens"] for r in mine)), 4
            )
            for phase in (FITS, OVER)
            if (mine := [r for r in serving["records"] if r["side"] == ATTNSTORE and r["phase"] == phase])
        }
        summary["attnstore_chunk_reads_by_tier"] = _reads_by_tier(serving.get("attnstore", {}))
    summary["pass"], verdict_lines = verdicts(summary)
    summary["unavailable"] = {
        name: peer["unavailable"] for name, peer in document["peers"].items() if peer["unavailable"]
    }
    summary["quick"] = args.quick
    document.update(
        summary=summary,
        machine=machine,
        run_seconds=round(seconds, 1),
        finished_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        peers_dir=str(peers_dir()),
        command="make bench-peers",
    )
    save_results("peers", document)
    where = f"{machine['cpu_model']}, {machine['cpu_cores_usable']} cores"
    print(
        f"machine: {where}, {machine['ram_bytes'] / 2**30:.0f} GiB RAM; python {machine['python']}; "
        f"peers: " + ", ".join(f"{n} {p['version'] or 'unavailable'}" for n, p in document["peers"].items())
    )
    print(f"run took {seconds:.0f} s\n")
    if store:
        plot_store(
            store["rows"],
            f"attnstore daemon vs LMCache server ({where}); SmolLM2-135M bf16 KV chunks",
            RESULTS_DIR / "peers_store.png",
        )
        print(format_store_table(store["rows"]))
        print()
    if serving and serving["records"]:
        plot_serving(
            serving["records"],
            f"TTFT per turn, vLLM (CPU, prefix caching) vs attnstore; SmolLM2-135M fp32, "
            f"KV space {serving['config']['kv_cache_bytes'] // MiB} MiB ({where})",
            RESULTS_DIR / "peers_serving.png",
        )
        print(format_serving_table(serving["records"]))
        print()
    for name, reason in summary["unavailable"].items():
        lines = reason.strip().splitlines() or [""]
        print(f"UNAVAILABLE  {name}: {lines[0]}" + (f" ... {lines[-1]}" if len(lines) > 1 else ""))
    print("\n".join(verdict_lines))
    print(json.dumps(summary))


def _reads_by_tier(attnstore: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Chunk reads the daemon served from each tier (and keys it missed) during each phase:
    its counters run from its start, so each phase is the difference to the one before."""
    reads, before = {}, {"dram": 0, "ssd": 0, "missed": 0}
    for phase, stats in attnstore.get("daemon_stats_after_phase", {}).items():
        now = {
            "dram": int(stats.get("dram", {}).get("hits", 0)),
            "ssd": int(stats.get("ssd", {}).get("hits", 0)),
            "missed": int(stats.get("misses", 0)),
        }
        reads[phase] = {tier: now[tier] - before[tier] for tier in now}
        before = now
    return reads
