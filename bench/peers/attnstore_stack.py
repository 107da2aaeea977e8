"""attnstore's side of the serving comparison: the whole local stack as processes on
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

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AsyncAttnStoreClient
from attnstore_scheduler.launcher import SchedulerProcess
from attnstore_scheduler.settings import NodeSpec
from inference_worker.launcher import WorkerProcess
from kvstore_daemon.launcher import DaemonProcess

MiB = 1024 * 1024
NODE = "node-a"
WORKER_SETTINGS = {"chunk_tokens": 64, "dtype": "float32", "device": "cpu", "health_check_interval_seconds": 0,
                   "log_level": "WARNING"}
SCHEDULER_SETTINGS = {"requests_per_second": 1_000_000, "requests_burst": 1_000_000, "log_level": "WARNING"}
DAEMON_SETTINGS = {"dram_block_bytes": 1 * MiB, "ssd_capacity_bytes": 8192 * MiB, "max_chunk_bytes": 32 * MiB,
                   "log_level": "WARNING"}


@dataclass(frozen=True)
class TurnTiming:
    ttft_ms: float
    total_ms: float
    prompt_tokens: int
    completion_tokens: int
    reused_tokens: int
    server_ttft_ms: float  # the scheduler's own measure (request received to first token sent)


@dataclass
class AttnstoreStack:
    work_dir: Path
    model_dir: Path
    dram_bytes: int
    daemon: DaemonProcess | None = None
    worker: WorkerProcess | None = None
    scheduler: SchedulerProcess | None = None
    start_seconds: float = 0.0
    _shm_dir: Path | None = field(default=None, repr=False)

    def start(self) -> None:
        """Starts every service; stops them all on a failure."""
        started = time.monotonic()
        try:
            shm_root = Path("/dev/shm") if Path("/dev/shm").is_dir() else self.work_dir
            self._shm_dir = Path(tempfile.mkdtemp(prefix="attnstore-peers-", dir=shm_root))
            self.daemon = DaemonProcess(self.work_dir / "ssd", self._shm_dir, self.work_dir / "daemon.log",
                                        {**DAEMON_SETTINGS, "dram_capacity_bytes": self.dram_bytes})
            self.daemon.start()
            self.worker = WorkerProcess(self.work_dir / "worker.log", model_dir=self.model_dir,
                                        kvstore_address=self.daemon.address, settings=WORKER_SETTINGS)
            self.worker.start()
            node = NodeSpec(name=NODE, daemon_address=self.daemon.address, worker_addresses=(self.worker.address,))
            self.scheduler = SchedulerProcess(self.work_dir / "scheduler.log", nodes=[node],
                                              settings=SCHEDULER_SETTINGS)
            self.scheduler.start()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    @property
    def address(self) -> str:
        assert self.scheduler is not None
        return self.scheduler.address

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in (self.daemon, self.worker, self.scheduler)
                if process is not None and process.pid is not None]

    def stop(self) -> dict[str, int | None]:
        """Stops in reverse start order; exit codes by service (0: a graceful stop)."""
        codes = {name: process.stop() for name, process in
                 (("scheduler", self.scheduler), ("worker", self.worker), ("daemon", self.daemon))
                 if process is not None}
        if self._shm_dir is not None:
            shutil.rmtree(self._shm_dir, ignore_errors=True)
        return codes


async def chat_turn(client: AsyncAttnStoreClient, session_id: str, message: str, max_tokens: int) -> TurnTiming:
    """One streamed, greedy Chat turn."""
    sent, first = time.perf_counter(), None
    async for event in client.stream_chat(session_id, message, max_tokens=max_tokens, temperature=0.0):
        if isinstance(event, api.TurnStats):  # the last event
            done = time.perf_counter()
            return TurnTiming(((first or done) - sent) * 1000, (done - sent) * 1000, event.prompt_tokens,
                              event.generated_tokens, event.reused_tokens, event.ttft_ms)
        first = first or time.perf_counter()
    raise RuntimeError("the Chat stream ended without its stats")
