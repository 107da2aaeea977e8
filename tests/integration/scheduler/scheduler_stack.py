"""The scheduler's integration test stack: real processes end to end (imported by the
tests of this folder; the fixtures are in conftest.py).

`RedisFactory` starts private redis-server processes (a free port, a temporary
directory). `Stack` is a LocalStack of one daemon + workers + a scheduler (+ the Redis it
was given), all real processes readied through their ready files; its workers run a tiny
random-weight Llama (greedy tokens are deterministic, so a turn replayed on another worker decodes the
same answer). The two workers sit on two nodes, "node-a" and "node-b", that share the one
daemon (cheap on a 2-core machine; the scheduler routes by node name all the same).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from process_factory import ProcessFactory
from stack_clients import StackClients

from attnstore.api_client import AttnStoreClient
from attnstore.server.redis_process import RedisProcess
from attnstore_cli.local_stack import LocalStack
from attnstore_cli.stack_spec import StackSpec, WorkerSpec
from attnstore_scheduler.redis_session_store import RedisSessionStore
from inference_worker.launcher import WorkerProcess

T = TypeVar("T")
MiB = 1024 * 1024
CHUNK_TOKENS = 16
# Tenants and their keys; "admin" is the scheduler's admin tenant.
API_KEYS = {"acme": "key-acme", "globex": "key-globex", "admin": "key-admin", "full": "key-full"}
TINY_LLAMA = {"max_position_embeddings": 4096, "initializer_range": 0.2}
WORKER_SETTINGS = {
    "chunk_tokens": CHUNK_TOKENS,
    "max_prompt_tokens": 4096,
    "max_new_tokens": 2048,
    "health_check_interval_seconds": 1.0,
    "shutdown_grace_seconds": 5,
    # These tests assert reuse, not speed: on a loaded machine a Lookup past the 0.5 s default
    # turns into a recompute (reused_tokens 0; seen once at load 10-15).
    "lookup_timeout_seconds": 10.0,
}
# 64 KiB blocks: the tiny model's chunks are 8 KiB, and a long session's prefix must fit.
DAEMON_SETTINGS = {
    "dram_capacity_bytes": 64 * MiB,
    "dram_block_bytes": 64 * 1024,
    "ssd_capacity_bytes": 256 * MiB,
    "max_chunk_bytes": 16 * MiB,
}
SCHEDULER_SETTINGS = {
    "worker_health_interval_seconds": 0.5,
    "health_check_interval_seconds": 0.5,
    "expiry_sweep_interval_seconds": 0.2,
    "shutdown_grace_seconds": 5,
    "log_level": "DEBUG",
}


class RedisFactory(ProcessFactory[RedisProcess]):
    """Starts redis-server processes under `root`; `close()` stops them all."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self._root = root

    def __call__(self, *, persistent: bool = False) -> RedisProcess:
        return self._start(RedisProcess(self._root / f"redis{len(self._started)}", persistent=persistent))


@dataclass
class Stack(StackClients):
    """One LocalStack (attnstore_cli.local_stack) with the clients the tests open on it."""

    local: LocalStack
    model_dir: Path
    redis: RedisProcess | None
    metrics_port: int | None = None
    worker_metrics_ports: dict[str, int] = field(default_factory=dict)  # by node
    _clients: list[AttnStoreClient] = field(default_factory=list)

    @property
    def workers(self) -> dict[str, WorkerProcess]:
        """By node (each worker is named after its node)."""
        return self.local.workers

    def client(self, tenant: str | None = "acme") -> AttnStoreClient:
        """A client with `tenant`'s key (None: no key), closed with the stack."""
        return self._open_client(API_KEYS[tenant] if tenant is not None else None)


StartStack = Callable[..., Stack]  # conftest.py's module_stacks: a stack on a model directory


def start_stack(
    root: Path,
    model_dir: Path,
    *,
    redis: RedisProcess | None,
    worker_nodes: tuple[str, ...] = ("node-a", "node-b"),
    scheduler_settings: dict[str, object] | None = None,
    worker_metrics: bool = False,
    daemon_settings: dict[str, object] | None = None,
    worker_settings: dict[str, object] | None = None,
) -> Stack:
    """`redis` None: the embedded session store. `worker_metrics`: each worker serves
    /metrics on a free port (Stack.worker_metrics_ports; the scheduler's, when its settings
    name metrics_port 0, in Stack.metrics_port). `worker_settings`: every worker's,
    beside WORKER_SETTINGS."""
    workers = tuple(
        WorkerSpec(
            node, settings={**({"metrics_port": 0} if worker_metrics else {}), **(worker_settings or {})}
        )
        for node in worker_nodes
    )
    settings = {**SCHEDULER_SETTINGS, **(scheduler_settings or {})}
    spec = StackSpec(
        work_dir=root,
        model_dir=model_dir,
        workers=workers,
        redis_url=redis.url if redis is not None else None,
        api_keys=API_KEYS,
        daemon_settings={**DAEMON_SETTINGS, **(daemon_settings or {})},
        worker_settings=WORKER_SETTINGS,
        scheduler_settings=settings,
    )
    local = LocalStack(spec).start()
    worker_metrics_ports = {
        node: port for node, worker in local.workers.items() if (port := worker.metrics_port)
    }
    return Stack(local, model_dir, redis, local.scheduler.metrics_port, worker_metrics_ports)


def wait_for(condition: Callable[[], T], *, what: str, timeout_seconds: float = 20.0) -> T:
    """Polls `condition` until it returns something truthy (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout_seconds
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds}s waiting for {what}")
        time.sleep(0.05)
    return value


def redis_store(url: str, *, lock_ttl_seconds: float, lock_wait_seconds: float) -> RedisSessionStore:
    """A session store on the Redis at `url`, as a scheduler replica opens it."""
    return RedisSessionStore(
        url,
        expiry_grace_seconds=60,
        lock_ttl_seconds=lock_ttl_seconds,
        lock_wait_seconds=lock_wait_seconds,
        max_connections=20,
        pool_timeout_seconds=5,
    )
