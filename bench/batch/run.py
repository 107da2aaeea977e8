"""`make bench-batch`: the worker's engine batching concurrent sessions, against itself at
batch 1 and vLLM CPU, on the real SmolLM2-135M-Instruct (fp32, CPU), in one run.

Serving (serving.py): ShareGPT multi-turn sessions through the public API at 1, 4, 16
and 32 concurrent sessions; per system and level, output tokens/s, turns/s, TTFT and
inter-token latency p50/p99. Memory (measure_memory.py, in-process on the engine's
BlockPool and Scheduler with real token ids): the pool's KV waste, sessions that fit one
pool with a shared 1,000-token system prompt vs without sharing, and the KV saved by
forking n = 2, 4, 6 parallel samples.

Results: the tables, the targets as PASS/FAIL lines, bench/results/batch.json and
batch.png (not with --quick), and the JSON summary as the last line.

    python -m bench batch [--quick] [--no-vllm] [--levels 1 4 16 32] ...
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import Any

from transformers import AutoConfig, AutoTokenizer

from bench.batch.measure_memory import MemoryConfig, measure_memory
from bench.batch.report import (
    BATCH1,
    ENGINE,
    TARGETS,
    VLLM,
    format_memory,
    format_serving,
    met,
    plot,
    verdicts,
)
from bench.batch.serving import ServingConfig, run_serving
from bench.batch.stats import ratio
from bench.batch.workload import level_dialogues
from bench.common.machine import machine_info
from bench.common.results import RESULTS_DIR, print_report, save_results, work_dir
from bench.peers.install import PeerVenv, ensure_peer
from bench.peers.run import usable_cores_bind
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import default_model_dir
from inference_worker.settings import WorkerSettings

WORK_DIR = work_dir("batch")
MiB = 1024 * 1024
FP32_BYTES = 4
AT = 16  # the level the targets are read at, and the memory replay's concurrency
# The memory part's conversations: up to 4 turns, prompts up to 1,024 tokens, answers cut to 256.
MEMORY_TURNS, MEMORY_PROMPT_TOKENS, MEMORY_ANSWER_TOKENS = 4, 1024, 256


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="levels 1, 4, 16; 2 turns of at most 16 tokens; short messages: a smoke run "
        "(results are not saved)",
    )
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM out (it takes minutes to start)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 32], help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=3, help="turns of every session")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every turn (greedy)")
    parser.add_argument("--max-message-tokens", type=int, default=200, help="longest user message kept")
    parser.add_argument(
        "--kv-memory-mib",
        type=int,
        default=2048,
        help="each worker's KV pool, each daemon's DRAM tier and vLLM's KV space",
    )
    parser.add_argument("--vllm-block-size", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--omp-threads-bind", default=usable_cores_bind())
    parser.add_argument("--system-prompt-tokens", type=int, default=1000)
    parser.add_argument(
        "--capacity-pool-mib", type=int, default=1024, help="the pool sessions are fitted into"
    )
    parser.add_argument(
        "--memory-conversations", type=int, default=48, help="ShareGPT conversations per measure"
    )
    parser.add_argument(
        "--worker-openmp-spin-count",
        type=int,
        default=None,
        help="the workers' openmp_spin_count (their threads spin between a forward's parallel regions): "
        "for an idle machine only",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.levels, args.turns, args.max_tokens, args.max_message_tokens = [1, 4, 16], 2, 16, 100
        args.memory_conversations = 32
    return args


def summarize(cells: dict[str, dict[int, dict[str, Any]]], memory: dict[str, Any]) -> dict[str, Any]:
    def throughput(system: str) -> float | None:
        return cells.get(system, {}).get(AT, {}).get("output_tokens_per_s")

    measured = {
        "throughput_vs_batch1_at_16": ratio(throughput(ENGINE), throughput(BATCH1)),
        "throughput_vs_vllm_at_16": ratio(throughput(ENGINE), throughput(VLLM)),
        "kv_waste_fraction": memory["kv_waste_fraction"],
        "shared_prefix_capacity_gain": memory["shared_prefix_capacity_gain"],
    }
    return {
        **measured,
        "output_tokens_per_s": {
            system: {level: c["output_tokens_per_s"] for level, c in levels.items()}
            for system, levels in cells.items()
        },
        "ttft_p50_ms": {
            system: {level: c["ttft_p50_ms"] for level, c in levels.items()}
            for system, levels in cells.items()
        },
        "parallel_sampling_saved_fraction": {
            name: sampling["saved_fraction"] for name, sampling in memory["parallel_sampling"].items()
        },
        "targets": {key: f"{sense} {target}" for key, (sense, target, _) in TARGETS.items()},
        "targets_met": {key: met(key, measured[key]) for key in TARGETS},
    }


def main(argv: list[str]) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.monotonic()
    model_dir = default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    geometry = ModelGeometry.of(AutoConfig.from_pretrained(model_dir))
    token_bytes = geometry.kv_bytes_per_token(FP32_BYTES)
    defaults = WorkerSettings.model_fields
    block_tokens = defaults["block_tokens"].default
    block_bytes = block_tokens * token_bytes
    memory = measure_memory(
        tokenizer,
        MemoryConfig(
            block_tokens=block_tokens,
            max_batch_tokens=defaults["max_batch_tokens"].default,
            pool_blocks=args.kv_memory_mib * MiB // block_bytes,
            capacity_pool_blocks=args.capacity_pool_mib * MiB // block_bytes,
            kv_bytes_per_token=token_bytes,
            system_prompt_tokens=args.system_prompt_tokens,
            conversations=args.memory_conversations,
            waste_concurrency=AT,
            max_turns=MEMORY_TURNS,
            max_prompt_tokens=MEMORY_PROMPT_TOKENS,
            max_answer_tokens=MEMORY_ANSWER_TOKENS,
            seed=args.seed,
        ),
    )
    dialogues = level_dialogues(
        tokenizer, args.levels, turns=args.turns, seed=args.seed, max_message_tokens=args.max_message_tokens
    )
    peer = PeerVenv(VLLM, None, reason="--no-vllm") if args.no_vllm else ensure_peer("vllm")
    config = ServingConfig(
        model_dir,
        args.kv_memory_mib * MiB,
        args.levels,
        args.turns,
        args.max_tokens,
        args.vllm_block_size,
        args.max_model_len,
        args.omp_threads_bind,
        args.worker_openmp_spin_count,
    )
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    WORK_DIR.mkdir(parents=True)
    serving = run_serving(peer, config, dialogues, WORK_DIR)
    cells = serving.pop("cells")
    summary = summarize(cells, memory)
    result = {
        "summary": summary,
        "args": vars(args),
        "cells": cells,
        "memory": memory,
        **serving,
        "machine": machine_info(WORK_DIR, packages=("torch", "transformers")),
        "vllm": peer.version,
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    if not args.quick:
        save_results("batch", result)
        plot(
            cells,
            memory,
            "bench-batch: SmolLM2-135M-Instruct fp32 on CPU, ShareGPT sessions",
            RESULTS_DIR / "batch.png",
        )
    if not any(any(codes.values()) for codes in serving["exit_codes"].values()):
        shutil.rmtree(WORK_DIR, ignore_errors=True)
    print(f"bench-batch took {result['wall_seconds']:.0f} s", file=sys.stderr)
    print_report(format_serving(cells) + "\n\n" + format_memory(memory), verdicts(summary), summary)
    return summary
