"""The services the load benchmark drives, as local processes on loopback: Redis (the
session store; the scheduler's embedded store when redis-server is not installed), one
KV-store daemon, two inference workers on two nodes sharing that daemon, and the
scheduler in front with authentication on. `pids()` names every process for the memory
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

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from attnstore.server.process import ServiceProcess
from attnstore.server.redis_process import RedisProcess
from attnstore_scheduler.launcher import SchedulerProcess
from attnstore_scheduler.settings import NodeSpec
from inference_worker.launcher import WorkerProcess
from kvstore_daemon.launcher import DaemonProcess

MiB = 1024 * 1024
API_KEY = "bench-load-key"
TENANT = "bench"
NODES = ("node-a", "node-b")
DAEMON_SETTINGS = {
    "dram_block_bytes": 32 * 1024,
    "max_chunk_bytes": 4 * MiB,
    "log_level": "WARNING",
}
WORKER_SETTINGS = {
    "chunk_tokens": 16,
    "max_new_tokens": 32,
    "dtype": "float32",
    "device": "cpu",
    "log_level": "WARNING",
}
SCHEDULER_SETTINGS = {"requests_per_second": 1_000_000, "requests_burst": 1_000_000, "log_level": "WARNING"}


@dataclass
class LoadStack:
    work_dir: Path
    model_dir: Path
    daemon_settings: dict[str, object] = field(default_factory=dict)  # over DAEMON_SETTINGS
    scheduler_settings: dict[str, object] = field(default_factory=dict)  # over SCHEDULER_SETTINGS
    redis: RedisProcess | None = None
    daemon: DaemonProcess | None = None
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    scheduler: SchedulerProcess | None = None
    _shm_dir: Path | None = None

    @property
    def session_store(self) -> str:
        return "redis" if self.redis is not None else "embedded"

    @property
    def address(self) -> str:
        assert self.scheduler is not None
        return self.scheduler.address

    @property
    def address_of_daemon(self) -> str:
        assert self.daemon is not None
        return self.daemon.address

    def start(self) -> None:
        """Starts every service (Redis only when installed); stops them all on a failure."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        if shutil.which("redis-server") is not None:
            self.redis = RedisProcess(self.work_dir / "redis", persistent=True)
            self.redis.start()
        shm_root = Path("/dev/shm") if Path("/dev/shm").is_dir() else self.work_dir
        self._shm_dir = Path(tempfile.mkdtemp(prefix="attnstore-load-", dir=shm_root))
        self.daemon = DaemonProcess(
            self.work_dir / "ssd",
            self._shm_dir,
            self.work_dir / "daemon.log",
            {**DAEMON_SETTINGS, **self.daemon_settings},
        )
        self.daemon.start()
        for node in NODES:
            self.workers[node] = WorkerProcess(
                self.work_dir / f"worker-{node}.log",
                model_dir=self.model_dir,
                kvstore_address=self.daemon.address,
                settings=WORKER_SETTINGS,
            )
            self.workers[node].start()
        keys = self.work_dir / "api-keys.json"
        keys.write_text(json.dumps({TENANT: [hashlib.sha256(API_KEY.encode()).hexdigest()]}))
        self.scheduler = SchedulerProcess(
            self.work_dir / "scheduler.log",
            nodes=[
                NodeSpec(name=node, daemon_address=self.daemon.address, worker_addresses=(w.address,))
                for node, w in self.workers.items()
            ],
            redis_url=self.redis.url if self.redis is not None else None,
            api_keys_file=keys,
            settings={**SCHEDULER_SETTINGS, **self.scheduler_settings},
        )
        self.scheduler.start()

    def services(self) -> dict[str, ServiceProcess]:
        named = {
            "scheduler": self.scheduler,
            **{f"worker {n}": w for n, w in self.workers.items()},
            "daemon": self.daemon,
        }
        return {name: process for name, process in named.items() if process is not None}

    def pids(self) -> dict[str, int]:
        """Every running process of the stack by name (Redis included)."""
        pids = {name: process.pid for name, process in self.services().items()}
        if self.redis is not None:
            pids["redis"] = self.redis.pid
        return {name: pid for name, pid in pids.items() if pid is not None}

    def stop(self) -> dict[str, int | None]:
        """Stops in reverse start order; exit codes by service (0: a graceful stop)."""
        codes = {name: process.stop() for name, process in self.services().items()}
        if self.redis is not None:
            self.redis.stop()
        if self._shm_dir is not None:
            shutil.rmtree(self._shm_dir, ignore_errors=True)
        return codes
