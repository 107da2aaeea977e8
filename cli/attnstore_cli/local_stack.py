"""The whole attnstore stack as local processes: Redis (or the scheduler's embedded
session store), one KV-store daemon, one inference worker and the scheduler, started in
dependency order, each readied by its health, and stopped in reverse order with nothing
left behind (no child process, no shared-memory arena)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from attnstore.server.process import ServiceProcess
from attnstore.server.redis_process import RedisProcess
from attnstore_cli.stack_state import SessionStoreKind, StackState
from attnstore_scheduler.launcher import SchedulerProcess
from attnstore_scheduler.settings import NodeSpec
from inference_worker.launcher import WorkerProcess
from kvstore_daemon.launcher import DaemonProcess

GiB = 1024**3
NODE_NAME = "local"
# Small blocks so that chunks of a small model (or of few tokens) don't each take a 2 MiB
# block of a laptop-sized arena; a chunk spans as many blocks as it needs.
DRAM_BLOCK_BYTES = 256 * 1024
SessionStoreChoice = Literal["auto", "redis", "embedded"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class StackError(Exception):
    """The stack cannot start as asked; the message says what to change."""


@dataclass(frozen=True)
class StackOptions:
    data_dir: Path  # the SSD tier, Redis' files and the logs
    model_dir: Path | None = None  # None: the default model (SmolLM2-135M-Instruct)
    session_store: SessionStoreChoice = "auto"
    redis_url: str | None = None  # an external Redis; wins over session_store
    scheduler_port: int = 50071  # 0 picks a free one
    openai_port: int = 8000  # the scheduler's OpenAI-compatible HTTP API; 0 picks a free one
    dram_bytes: int = 1 * GiB
    ssd_bytes: int = 8 * GiB
    worker_settings: dict[str, object] | None = None
    log_level: str = "WARNING"


def choose_session_store(choice: SessionStoreChoice, redis_url: str | None) -> SessionStoreKind:
    """auto: Redis when `redis-server` is installed (or a URL is given), else embedded."""
    if redis_url is not None:
        return "redis"
    if choice == "embedded":
        return "embedded"
    if shutil.which("redis-server") is not None:
        return "redis"
    if choice == "redis":
        raise StackError(
            "--session-store redis: redis-server is not installed; install it (`make redis`), "
            "pass --redis-url, or use --session-store embedded"
        )
    return "embedded"


class LocalStack:
    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self.session_store = choose_session_store(options.session_store, options.redis_url)
        self.logs_dir = options.data_dir / "logs"
        self.redis: RedisProcess | None = None
        self.daemon: DaemonProcess | None = None
        self.worker: WorkerProcess | None = None
        self.scheduler: SchedulerProcess | None = None
        self._shm_dir: Path | None = None

    def start(self, progress: Callable[[str], None]) -> StackState:
        """Starts every service; on any failure stops what started and re-raises."""
        try:
            return self._start(progress)
        except BaseException:
            self.stop()
            raise

    def _start(self, progress: Callable[[str], None]) -> StackState:
        options = self.options
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        redis_url = options.redis_url
        if self.session_store == "redis" and redis_url is None:
            progress("starting Redis (append-only file in the data directory)")
            self.redis = RedisProcess(options.data_dir / "redis", persistent=True)
            self.redis.own_session = True
            self.redis.start()
            redis_url = self.redis.url
        progress("starting the KV-store daemon")
        shm_root = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        self._shm_dir = Path(tempfile.mkdtemp(prefix="attnstore-", dir=shm_root))
        self.daemon = DaemonProcess(
            options.data_dir / "ssd",
            self._shm_dir,
            self.logs_dir / "kvstore-daemon.log",
            {
                "dram_capacity_bytes": options.dram_bytes,
                "ssd_capacity_bytes": options.ssd_bytes,
                "dram_block_bytes": DRAM_BLOCK_BYTES,
                "log_level": options.log_level,
            },
        )
        self.start_service(self.daemon)
        progress("starting the inference worker (loads the model; the first start converts it)")
        self.worker = WorkerProcess(
            self.logs_dir / "inference-worker.log",
            model_dir=options.model_dir,
            kvstore_address=self.daemon.address,
            settings={"log_level": options.log_level, **(options.worker_settings or {})},
        )
        self.start_service(self.worker)
        progress(f"starting the scheduler (sessions in {self.session_store})")
        openai_port = options.openai_port or free_port()
        self.scheduler = SchedulerProcess(
            self.logs_dir / "scheduler.log",
            nodes=[
                NodeSpec(
                    name=NODE_NAME,
                    daemon_address=self.daemon.address,
                    worker_addresses=(self.worker.address,),
                )
            ],
            redis_url=redis_url,
            settings={"log_level": options.log_level, "openai_listen_address": f"127.0.0.1:{openai_port}"},
        )
        self.scheduler.port = options.scheduler_port
        self.start_service(self.scheduler)
        return StackState(
            scheduler_address=self.scheduler.address,
            openai_url=f"http://127.0.0.1:{openai_port}/v1",
            daemon_address=self.daemon.address,
            worker_addresses=[self.worker.address],
            session_store=self.session_store,
            redis_url=redis_url,
            data_dir=options.data_dir,
            logs_dir=self.logs_dir,
            shm_dir=self._shm_dir,
            pid=os.getpid(),
        )

    @staticmethod
    def start_service(service: ServiceProcess) -> None:
        """Ctrl-C in the terminal reaches only us; stop() then stops the services in order."""
        service.own_session = True
        service.start()

    def services(self) -> dict[str, ServiceProcess]:
        started = {
            "scheduler": self.scheduler,
            "inference-worker": self.worker,
            "kvstore-daemon": self.daemon,
        }
        return {name: service for name, service in started.items() if service is not None}

    def dead_services(self) -> list[str]:
        """Services that exited on their own (a crash), by name."""
        dead = [name for name, service in self.services().items() if not service.running]
        if self.redis is not None and not self.redis.running:
            dead.append("redis")
        return dead

    def stop(self) -> dict[str, int | None]:
        """Stops in reverse start order; exit codes by service (0: a graceful stop)."""
        codes = {name: service.stop() for name, service in self.services().items()}
        if self.redis is not None:
            self.redis.stop()
        if self._shm_dir is not None:
            shutil.rmtree(self._shm_dir, ignore_errors=True)
        return codes
