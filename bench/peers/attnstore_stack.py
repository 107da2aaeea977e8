"""attnstore's side of the serving comparison: the whole local stack (a LocalStack) on
loopback (one KV-store daemon, one inference worker on the real SmolLM2-135M-Instruct in
fp32, the scheduler with its embedded session store and no auth), driven through the
public API (`AsyncAttnStoreClient.stream_chat`), one session per conversation.

The daemon's DRAM tier gets the same bytes as vLLM's KV space, so whatever attnstore
keeps beyond that comes from its SSD tier, not from more memory. Settings that differ
from the defaults, and why:
- worker: 64-token chunks (chosen when only full chunks were stored, where short chat
  turns reused more with them; the published results use them), no periodic health-check
  op (nothing else on the cores);
- daemon: 1 MiB arena blocks (a 64-token fp32 chunk is 2.8 MiB: 3 blocks, not 2 x 2 MiB);
- scheduler: no rate limit (one client makes every call).
TTFT is what the client sees: Chat sent to the first streamed token.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AsyncAttnStoreClient
from attnstore_cli.local_stack import LocalStack
from attnstore_cli.stack_spec import StackSpec, WorkerSpec

MiB = 1024 * 1024
NODE = "node-a"
WORKER_SETTINGS = {
    "chunk_tokens": 64,
    "dtype": "float32",
    "device": "cpu",
    "health_check_interval_seconds": 0,
}
SCHEDULER_SETTINGS = {"requests_per_second": 1_000_000, "requests_burst": 1_000_000}
DAEMON_SETTINGS = {"dram_block_bytes": 1 * MiB, "ssd_capacity_bytes": 8192 * MiB, "max_chunk_bytes": 32 * MiB}


@dataclass(frozen=True)
class TurnTiming:
    ttft_ms: float
    total_ms: float
    prompt_tokens: int
    completion_tokens: int
    reused_tokens: int
    server_ttft_ms: float  # the scheduler's own measure (request received to first token sent)


def attnstore_stack(
    work_dir: Path, model_dir: Path, dram_bytes: int, worker_overrides: Mapping[str, object] | None = None
) -> LocalStack:
    """The stack (not started), its DRAM tier `dram_bytes`; `worker_overrides` on top of
    WORKER_SETTINGS (turn_split.py: the worker's metrics port)."""
    return LocalStack(
        StackSpec(
            work_dir=work_dir,
            model_dir=model_dir,
            workers=(WorkerSpec(NODE),),
            daemon_settings={**DAEMON_SETTINGS, "dram_capacity_bytes": dram_bytes},
            worker_settings={**WORKER_SETTINGS, **(worker_overrides or {})},
            scheduler_settings=SCHEDULER_SETTINGS,
            log_level="WARNING",
        )
    )


def add_worker_threading_args(parser: argparse.ArgumentParser) -> None:
    """The worker's OpenMP threading as vLLM's CPU engine runs its own (run.py, turn_split.py)."""
    parser.add_argument(
        "--worker-openmp-spin-count",
        type=int,
        default=None,
        help="the worker's openmp_spin_count (its threads spin, not sleep, between a forward's "
        "parallel regions; vLLM's spin; unset: its default, sleeping threads): for an idle machine only",
    )
    parser.add_argument(
        "--worker-openmp-pin-threads",
        action="store_true",
        help="the worker's openmp_pin_threads (its OpenMP threads bound one per core, as vLLM's "
        "are): for cores the stack has alone",
    )


def worker_threading(spin_count: int | None, pin_threads: bool) -> dict[str, object]:
    """The worker settings for what `add_worker_threading_args` asked for (none: the defaults)."""
    return ({} if spin_count is None else {"openmp_spin_count": spin_count}) | (
        {"openmp_pin_threads": True} if pin_threads else {}
    )


async def chat_turn(
    client: AsyncAttnStoreClient, session_id: str, message: str, max_tokens: int
) -> TurnTiming:
    """One streamed, greedy Chat turn."""
    sent, first = time.perf_counter(), None
    async for event in client.stream_chat(session_id, message, max_tokens=max_tokens, temperature=0.0):
        if isinstance(event, api.TurnStats):  # the last event
            done = time.perf_counter()
            return TurnTiming(
                ((first or done) - sent) * 1000,
                (done - sent) * 1000,
                event.prompt_tokens,
                event.generated_tokens,
                event.reused_tokens,
                event.ttft_ms,
            )
        first = first or time.perf_counter()
    raise RuntimeError("the Chat stream ended without its stats")
