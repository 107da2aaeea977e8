"""TTFT and quality of prompt modules (Prompt Cache) on the real default model
(SmolLM2-135M-Instruct, fp32, CPU), served from module KV in a real daemon vs the same tokens
prefilled whole, side by side in one run.

Workloads (workload.py): a length sweep (one module of 256 to 4,096 tokens plus a short
question), document QA (long ShareGPT answers as modules, several per prompt in varying
subsets and orders, the question that followed as uncached text) and the paper's three
schemas (code generation: five file modules; personalization: six unions of five traits;
travel: a parameter and nested unions). For each prompt: TTFT (median of a few runs after
a warm-up, the full prefill's and the module turn's taken in turns; module KV from the
worker's module cache, and read from the daemon's DRAM), the perplexity of a reference
continuation and the greedy agreement of a short answer with the full prefill's; for
prompts of several modules, also with boundary repair at budgets of 5, 10 and 15% of each
module (but the first), by first tokens and by KV deviation (CacheBlend-style). Results: a
table, bench/results/modules.json and modules.png, and the JSON summary as the last line;
--quick runs a small version (smaller modules, fewer prompts) in a few minutes.
"""

from __future__ import annotations

import inference_worker.openmp_waiting  # noqa: F401  # isort: skip  -- before torch: measured as the worker runs

import argparse
import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog
import torch
from transformers import PreTrainedTokenizerBase

from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore.server.allocator import keep_large_buffers
from attnstore.server.logging import configure_logging
from attnstore.shm_arena import arena_root
from bench.common.machine import machine_info
from bench.common.results import RESULTS_DIR, print_report, save_results, work_dir
from bench.modules.measure import REPAIR_FRACTIONS, CaseResult, CaseRunner, RepairPoint
from bench.modules.report import format_table, plot, summarize, verdicts
from bench.modules.workload import (
    REFERENCE_TOKENS,
    Case,
    code_generation,
    doc_qa,
    length_sweep,
    personalization,
    travel,
)
from inference_worker.model_store import LoadedModel, default_model_dir, load_model
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource
from kvstore_daemon.launcher import DaemonProcess

WORKLOADS = ("length", "doc_qa", "code", "persona", "travel")
MiB = 1024 * 1024
SEED = 0
log = structlog.get_logger("bench.modules")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a small run: modules up to 1,024 tokens, 2 QA prompts"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help=f"comma-separated workloads to run, of {', '.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--lengths",
        help="comma-separated module lengths of the sweep (default 256,1024 with --quick, else 256 to 4096)",
    )
    parser.add_argument(
        "--results",
        help="bench/results/<name>.json and .png (default modules; modules-quick with --quick, which git "
        "ignores: a quick run never replaces the committed full run's files)",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="NAME",
        help="report the rows of earlier runs' results instead of running (a later run's workloads replace "
        "an earlier one's)",
    )
    args = parser.parse_args(argv)
    args.results = args.results or ("modules-quick" if args.quick else "modules")
    args.only = set(args.only.split(","))
    if not args.only <= set(WORKLOADS):
        parser.error(f"--only takes workloads of {', '.join(WORKLOADS)}")
    return args


async def bench(args: argparse.Namespace) -> None:
    loaded = load_model(default_model_dir(), torch.float32, "cpu")
    tokenizer = loaded.tokenizer
    if args.lengths:
        lengths = [int(length) for length in args.lengths.split(",")]
    else:
        lengths = [256, 1024] if args.quick else [256, 512, 1024, 2048, 4096]
    workloads = quality_workloads(tokenizer, args.quick)
    workloads["length"] = lambda: length_sweep(tokenizer, lengths, SEED)
    cases = [case for name in WORKLOADS if name in args.only for case in workloads[name]()]
    work = work_dir(args.results)
    async with serving(loaded, work) as (engine, source):
        runner = CaseRunner(
            engine,
            source,
            repeats=2 if args.quick else 5,
            continuation_tokens=16 if args.quick else REFERENCE_TOKENS,
            answer_tokens=16 if args.quick else 32,
        )
        rows = []
        for case in cases:
            rows.append(await runner.run(case))
            log.info("case", workload=case.workload, label=case.label, speedup=round(rows[-1].speedup, 1))
        machine = machine_info(work)
    report(args, rows, {"workloads": sorted(args.only), "machine": machine})


def quality_workloads(tokenizer: PreTrainedTokenizerBase, quick: bool) -> dict[str, Callable[[], list[Case]]]:
    """The workloads of prompts with several modules (all but the length sweep), by name."""
    paper = 1 if quick else 3  # prompts per schema
    return {
        "doc_qa": lambda: doc_qa(
            tokenizer, docs=4 if quick else 8, prompts=2 if quick else 12, per_prompt=3, seed=SEED
        ),
        "code": lambda: code_generation(
            tokenizer, prompts=paper, file_tokens=200 if quick else 500, seed=SEED
        ),
        "persona": lambda: personalization(tokenizer, prompts=paper, seed=SEED),
        "travel": lambda: travel(tokenizer, prompts=paper, seed=SEED),
    }


@asynccontextmanager
async def serving(loaded: LoadedModel, work: Path) -> AsyncIterator[tuple[TurnEngine, KVSource]]:
    """A turn engine of `loaded` beside a real daemon in `work` (emptied first, removed
    after), and the bench's tenant source."""
    # The worker's malloc tuning (its entry point's start_service): without it this process
    # page-faulted a stored 4,096-token module's 188 MB of read tensors in again every turn
    # (83,000 minor faults a turn against 46,000, the rest the pool's first writes).
    keep_large_buffers()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    dram = 1024 * MiB
    shm_dir = tempfile.mkdtemp(prefix="attnstore-bench-", dir=arena_root(work, dram))
    daemon = DaemonProcess(
        work / "ssd",
        shm_dir,
        work / "daemon.log",
        {"dram_capacity_bytes": dram, "ssd_capacity_bytes": 4096 * MiB, "max_chunk_bytes": 64 * MiB},
    )
    daemon.start()
    try:
        async with AsyncKVStoreClient(daemon.address) as client:
            settings = WorkerSettings(
                chunk_tokens=256,
                kv_memory_bytes=2048 * MiB,
                module_read_timeout_seconds=30,
                layer_timeout_seconds=30,  # a late module layer would recompute the prompt: not what is timed
            )
            engine = TurnEngine(loaded, client, settings)
            try:
                yield engine, await engine.namespace_for(b"bench-modules")
            finally:
                await engine.close()
    finally:
        daemon.stop()
        shutil.rmtree(shm_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def report(args: argparse.Namespace, rows: list[CaseResult], about: dict[str, Any]) -> None:
    """The table, bench/results/<results>.json and .png, the verdicts and the summary."""
    summary = summarize(rows)
    title = f"prompt modules, SmolLM2-135M fp32 CPU{' (quick)' if args.quick else ''}"
    plot(rows, title, RESULTS_DIR / f"{args.results}.png")
    document = {"quick": args.quick, **about, "repair_fractions": list(REPAIR_FRACTIONS)}
    rows_json = [asdict(row) | {"speedup": row.speedup} for row in rows]
    save_results(args.results, document | {"rows": rows_json, "summary": summary})
    print_report(format_table(rows), verdicts(summary), summary)


def merge(args: argparse.Namespace) -> None:
    """One report from the rows of runs saved under other names (parts of one suite run in
    parallel processes: on a shared machine each gets its own share of the cores)."""
    parts = [json.loads((RESULTS_DIR / f"{name}.json").read_text()) for name in args.merge]
    rows: list[CaseResult] = []
    for part in parts:  # a later part's workloads replace an earlier part's rows of them
        rows = [row for row in rows if row.workload not in part["workloads"]]
        rows += [
            CaseResult(
                **{k: v for k, v in row.items() if k not in ("speedup", "curve")},
                curve=tuple(RepairPoint(**point) for point in row["curve"]),
            )
            for row in part["rows"]
        ]
    workloads = sorted({w for part in parts for w in part["workloads"]})
    report(args, rows, {"workloads": workloads, "machine": parts[0]["machine"], "merged_from": args.merge})


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    configure_logging("INFO", json=False)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.merge:
        merge(args)
        return
    asyncio.run(bench(args))
