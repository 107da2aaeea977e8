"""The whole attnstore stack as local processes, for the CLI, the benchmarks and the
tests: a spec in (stack_spec.py), addresses and a clean shutdown out.

Redis (or the scheduler's embedded session store), the daemons, the workers and the
scheduler start in dependency order, each awaited through its readiness (the ready file
of attnstore.server.process, a PING for Redis; never a fixed sleep), and stop in reverse
order with nothing left behind: no child process, no shared-memory arena.

It lives in the CLI's package because that package already depends on every service;
`attnstore` (services/) must not depend on the services that depend on it, and the
daemon and scheduler images install neither the CLI nor torch. Nothing here imports
torch: each service is launched as `python -m <service>` by its own launcher, its
settings passed through as environment variables.

    with LocalStack(StackSpec(work_dir, model_dir=model)) as stack:
        client = AttnStoreClient(stack.address)
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Self

from attnstore.security import token_digest
from attnstore.server.process import ServiceProcess
from attnstore.server.redis_process import RedisProcess
from attnstore.shm_arena import arena_root
from attnstore_cli.stack_spec import SessionStoreChoice, StackSpec, WorkerSpec
from attnstore_cli.stack_state import SessionStoreKind
from attnstore_scheduler.launcher import SchedulerProcess
from attnstore_scheduler.settings import NodeSpec
from inference_worker.launcher import WorkerProcess
from kvstore_daemon.launcher import DaemonProcess
from kvstore_daemon.settings import DaemonSettings

Progress = Callable[[str], None]


class StackError(Exception):
    """The stack cannot start as asked; the message says what to change."""


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
    def __init__(self, spec: StackSpec) -> None:
        self.spec = spec
        self.session_store = choose_session_store(spec.session_store, spec.redis_url)
        self.redis_url = spec.redis_url
        self.logs_dir = spec.work_dir / "logs"
        self.redis: RedisProcess | None = None
        self.daemons: list[DaemonProcess] = []
        self.workers: dict[str, WorkerProcess] = {}
        self.scheduler: SchedulerProcess | None = None

    @property
    def address(self) -> str:
        """The scheduler's public API."""
        if self.scheduler is None:
            raise StackError("this stack has no scheduler")
        return self.scheduler.address

    @property
    def daemon(self) -> DaemonProcess:
        """The first (or only) daemon."""
        return self.daemons[0]

    @property
    def worker(self) -> WorkerProcess:
        """The first (or only) worker."""
        return next(iter(self.workers.values()))

    def processes(self) -> dict[str, ServiceProcess]:
        """Every started service by name, in start order (Redis apart)."""
        named: dict[str, ServiceProcess] = {}
        named.update({self._daemon_name(index): daemon for index, daemon in enumerate(self.daemons)})
        named.update({f"worker {name}": worker for name, worker in self.workers.items()})
        if self.scheduler is not None:
            named["scheduler"] = self.scheduler
        return named

    def _daemon_name(self, index: int) -> str:
        return "daemon" if self.spec.daemons == 1 else f"daemon-{index}"

    def pids(self) -> dict[str, int]:
        """Every running process of the stack by name, Redis included."""
        pids = {name: process.pid for name, process in self.processes().items()}
        if self.redis is not None:
            pids["redis"] = self.redis.pid
        return {name: pid for name, pid in pids.items() if pid is not None}

    def dead_services(self) -> list[str]:
        """Services that exited on their own (a crash), by name."""
        dead = [name for name, process in self.processes().items() if not process.running]
        if self.redis is not None and not self.redis.running:
            dead.append("redis")
        return dead

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self, progress: Progress | None = None) -> Self:
        """Starts every service; on any failure stops what started and re-raises."""
        try:
            self._start(progress or (lambda step: None))
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, progress: Progress) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        if self.session_store == "redis" and self.redis_url is None:
            progress("starting Redis (append-only file in the work directory)")
            self._start_redis()
        progress("starting the KV-store daemon" + ("s" if self.spec.daemons > 1 else ""))
        self._start_daemons()
        progress("starting the inference workers (load the model; the first start converts it)")
        self._start_workers()
        if self.spec.scheduler:
            progress(f"starting the scheduler (sessions in {self.session_store})")
            self._start_scheduler()

    def _start_redis(self) -> None:
        self.redis = RedisProcess(self.spec.work_dir / "redis", persistent=True)
        self.redis.own_session = self.spec.own_sessions
        self.redis.start()
        self.redis_url = self.redis.url

    def _start_daemons(self) -> None:
        for index in range(self.spec.daemons):
            name = self._daemon_name(index)
            ssd_dir = self.spec.work_dir / name.replace("daemon", "ssd")
            shm_dir = Path(tempfile.mkdtemp(prefix="attnstore-", dir=self._arena_root()))
            log = self.logs_dir / f"{name}.log"
            self.daemons.append(
                DaemonProcess(ssd_dir, shm_dir, log, self.spec.daemon_service_settings(index))
            )
            self._launch(self.daemons[-1])

    def _start_workers(self) -> None:
        for worker in self.spec.workers:
            self.workers[worker.name] = self._worker_process(worker)
        # Model loads overlap their file reads; a lone worker starts in this thread (Ctrl-C).
        if len(self.workers) > 1:
            with ThreadPoolExecutor(len(self.workers)) as pool:
                list(pool.map(self._launch, self.workers.values()))
        else:
            for process in self.workers.values():
                self._launch(process)

    def _start_scheduler(self) -> None:
        self.scheduler = SchedulerProcess(
            self.logs_dir / "scheduler.log",
            nodes=self._nodes(),
            redis_url=self.redis_url,
            api_keys_file=self._write_api_keys(),
            settings=self.spec.scheduler_service_settings(),
        )
        self.scheduler.port = self.spec.scheduler_port
        self._launch(self.scheduler)

    def _arena_root(self) -> Path:
        """/dev/shm where it has room for a daemon's arena, else the temporary directory."""
        settings = self.spec.daemon_service_settings()
        room = settings.get("dram_capacity_bytes", DaemonSettings.model_fields["dram_capacity_bytes"].default)
        return arena_root(Path(tempfile.gettempdir()), int(str(room)))

    def add_worker(self, worker: WorkerSpec) -> WorkerProcess:
        """Starts one more worker on the running stack (stopped with it); the scheduler does
        not know it (e.g. a baseline that recomputes: `WorkerSpec("baseline", daemon=None)`)."""
        if worker.name in self.workers:
            raise StackError(f"a worker named {worker.name!r} already runs")
        self.workers[worker.name] = self._worker_process(worker)
        self._launch(self.workers[worker.name])
        return self.workers[worker.name]

    def _worker_process(self, worker: WorkerSpec) -> WorkerProcess:
        daemon = self.daemons[worker.daemon] if worker.daemon is not None else None
        return WorkerProcess(
            self.logs_dir / f"worker-{worker.name.replace(' ', '-')}.log",
            model_dir=self.spec.model_dir,
            kvstore_address=daemon.address if daemon is not None else None,
            settings=self.spec.worker_service_settings(worker),
        )

    def _launch(self, service: ServiceProcess) -> None:
        service.own_session = self.spec.own_sessions
        service.start()

    def _nodes(self) -> list[NodeSpec]:
        """The scheduler's topology: one node per worker node name, at its daemon (the spec
        made sure the workers of a node share one)."""
        daemons: dict[str, str] = {}
        workers: dict[str, list[str]] = {}
        for worker in self.spec.workers:
            if worker.daemon is not None:
                daemons[worker.node_name] = self.daemons[worker.daemon].address
                workers.setdefault(worker.node_name, []).append(self.workers[worker.name].address)
        return [
            NodeSpec(name=node, daemon_address=daemons[node], worker_addresses=tuple(addresses))
            for node, addresses in workers.items()
        ]

    def _write_api_keys(self) -> Path | None:
        if self.spec.api_keys is None:
            return None
        path = self.spec.work_dir / "api-keys.json"
        digests = {tenant: [token_digest(key)] for tenant, key in self.spec.api_keys.items()}
        path.write_text(json.dumps(digests))
        return path

    def stop(self) -> dict[str, int | None]:
        """Stops in reverse start order; exit codes by service (0: a graceful stop)."""
        codes = {name: process.stop() for name, process in reversed(self.processes().items())}
        if self.redis is not None:
            self.redis.stop()
        for daemon in self.daemons:
            shutil.rmtree(daemon.shm_dir, ignore_errors=True)
        return codes
