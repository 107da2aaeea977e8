"""The scheduler's integration test stack: real processes end to end (imported by the
tests of this folder; the fixtures are in conftest.py).

`RedisFactory` starts private redis-server processes (a free port, a temporary
directory). `Stack` is one daemon + workers + a scheduler (+ the Redis it was given), all
real processes readied through their ready files; its workers run a tiny random-weight
Llama (greedy tokens are deterministic, so a turn replayed on another worker decodes the
same answer). The two workers sit on two nodes, "node-a" and "node-b", that share the one
daemon (cheap on a 2-core machine; the scheduler routes by node name all the same).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from attnstore.api_client import AttnStoreClient
from attnstore.server.redis_process import RedisProcess
from attnstore_scheduler.launcher import SchedulerProcess
from attnstore_scheduler.settings import NodeSpec
from inference_worker.launcher import WorkerProcess
from kvstore_daemon.launcher import DaemonProcess

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
}
SCHEDULER_SETTINGS = {
    "worker_health_interval_seconds": 0.5,
    "health_check_interval_seconds": 0.5,
    "expiry_sweep_interval_seconds": 0.2,
    "shutdown_grace_seconds": 5,
    "log_level": "DEBUG",
}


class RedisFactory:
    """Starts redis-server processes under `root`; `close()` stops them all."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._started: list[RedisProcess] = []

    def __call__(self, *, persistent: bool = False) -> RedisProcess:
        process = RedisProcess(self._root / f"redis{len(self._started)}", persistent=persistent)
        self._started.append(process)
        process.start()
        return process

    def close(self) -> None:
        for process in self._started:
            process.stop()


@dataclass
class Stack:
    root: Path
    model_dir: Path
    daemon: DaemonProcess
    workers: dict[str, WorkerProcess]  # by node
    scheduler: SchedulerProcess
    redis: RedisProcess | None
    metrics_port: int | None = None
    worker_metrics_ports: dict[str, int] = field(default_factory=dict)  # by node
    _clients: list[AttnStoreClient] = field(default_factory=list)

    def client(self, tenant: str | None = "acme") -> AttnStoreClient:
        """A client with `tenant`'s key (None: no key), closed with the stack."""
        key = API_KEYS[tenant] if tenant is not None else None
        self._clients.append(AttnStoreClient(self.scheduler.address, key, timeout_seconds=120))
        return self._clients[-1]

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self.scheduler.stop()
        for worker in self.workers.values():
            worker.stop()
        self.daemon.stop()
        shutil.rmtree(self.daemon.shm_dir, ignore_errors=True)


def write_api_keys(path: Path) -> Path:
    digests = {tenant: [hashlib.sha256(key.encode()).hexdigest()] for tenant, key in API_KEYS.items()}
    path.write_text(json.dumps(digests))
    return path


def start_stack(
    root: Path,
    model_dir: Path,
    *,
    redis: RedisProcess | None,
    worker_nodes: tuple[str, ...] = ("node-a", "node-b"),
    scheduler_settings: dict[str, object] | None = None,
    worker_metrics: bool = False,
) -> Stack:
    """`worker_metrics`: each worker serves /metrics on a free port (Stack.worker_metrics_ports)."""
    shm_root = Path("/dev/shm") if Path("/dev/shm").is_dir() else root
    daemon = DaemonProcess(
        root / "ssd",
        Path(tempfile.mkdtemp(prefix="attnstore-test-", dir=shm_root)),
        root / "daemon.log",
        # 64 KiB blocks: the tiny model's chunks are 8 KiB, and a long session's prefix must fit.
        {
            "dram_capacity_bytes": 64 * MiB,
            "dram_block_bytes": 64 * 1024,
            "ssd_capacity_bytes": 256 * MiB,
            "max_chunk_bytes": 16 * MiB,
        },
    )
    daemon.start()
    workers: dict[str, WorkerProcess] = {}
    worker_metrics_ports = {node: free_port() for node in worker_nodes} if worker_metrics else {}
    try:
        for node in worker_nodes:
            metrics = {"metrics_port": worker_metrics_ports[node]} if worker_metrics else {}
            workers[node] = WorkerProcess(
                root / f"worker-{node}.log",
                model_dir=model_dir,
                kvstore_address=daemon.address,
                settings={**WORKER_SETTINGS, **metrics},
            )
            workers[node].start()
        nodes = [
            NodeSpec(name=node, daemon_address=daemon.address, worker_addresses=(worker.address,))
            for node, worker in workers.items()
        ]
        scheduler = SchedulerProcess(
            root / "scheduler.log",
            nodes=nodes,
            redis_url=redis.url if redis is not None else None,
            api_keys_file=write_api_keys(root / "api-keys.json"),
            settings={**SCHEDULER_SETTINGS, **(scheduler_settings or {})},
        )
        scheduler.start()
    except BaseException:
        for worker in workers.values():
            worker.stop()
        daemon.stop()
        raise
    metrics_port = (scheduler_settings or {}).get("metrics_port")
    return Stack(
        root, model_dir, daemon, workers, scheduler, redis, metrics_port, worker_metrics_ports  # type: ignore[arg-type]
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], T], *, what: str, timeout_seconds: float = 20.0) -> T:
    """Polls `condition` until it returns something truthy (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout_seconds
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds}s waiting for {what}")
        time.sleep(0.05)
    return value
