"""The services the load benchmark drives, a LocalStack on loopback: Redis (the session
store; the scheduler's embedded store when redis-server is not installed), one KV-store
daemon, two inference workers on two nodes sharing that daemon, and the scheduler in
front with authentication on. `LocalStack.pids()` names every process for the memory
sampler.

Settings that differ from the defaults, and why:
- workers: 16-token chunks (short chat turns reuse their history; 256-token chunks would
  reuse nothing for the first several turns), at most 32 new tokens;
- scheduler: no rate limit (one tenant makes every call; the limiter is not under test);
- daemon: 32 KiB arena blocks (a chunk of the benchmark model is 20 KiB); tiers small
  enough (run.py: 32 MiB DRAM, 48 MiB SSD) that the store fills during the warm-up.
  The daemon's index takes ~2.5 KB of heap per chunk it holds, so its memory grows until
  the SSD tier is full and eviction keeps the chunk count flat (bounded by the capacity).
"""

from __future__ import annotations

from pathlib import Path

from attnstore_cli.local_stack import LocalStack
from attnstore_cli.stack_spec import Settings, StackSpec, WorkerSpec

MiB = 1024 * 1024
API_KEY = "bench-load-key"
TENANT = "bench"
NODES = ("node-a", "node-b")
DAEMON_SETTINGS = {
    "dram_block_bytes": 32 * 1024,
    "max_chunk_bytes": 4 * MiB,
}
WORKER_SETTINGS = {
    "chunk_tokens": 16,
    "max_new_tokens": 32,
    "dtype": "float32",
    "device": "cpu",
}
SCHEDULER_SETTINGS = {"requests_per_second": 1_000_000, "requests_burst": 1_000_000}


def load_stack(
    work_dir: Path, model_dir: Path, *, daemon_settings: Settings, scheduler_settings: Settings
) -> LocalStack:
    """The stack (not started); `daemon_settings` and `scheduler_settings` go over the
    defaults above."""
    return LocalStack(
        StackSpec(
            work_dir=work_dir,
            model_dir=model_dir,
            workers=tuple(WorkerSpec(node) for node in NODES),
            session_store="auto",
            api_keys={TENANT: API_KEY},
            daemon_settings={**DAEMON_SETTINGS, **daemon_settings},
            worker_settings=WORKER_SETTINGS,
            scheduler_settings={**SCHEDULER_SETTINGS, **scheduler_settings},
            log_level="WARNING",
        )
    )
