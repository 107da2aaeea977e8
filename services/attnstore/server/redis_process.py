"""A private redis-server as a child process: for benchmarks and tests.

Loopback, a free port, its own directory; optionally persistent (append-only file,
fsync on every write) so a restart keeps the data. Readiness is a PING answered, polled
with a deadline (never a fixed sleep). The port is picked by binding port 0 and releasing
it, so another process may grab it first: the start is retried on a new port when the
server exits before answering. `restart()` keeps the port and the directory.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from attnstore.server.child_process import ChildProcess
from attnstore.server.ports import free_port

READY_TIMEOUT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 10.0
_POLL_SECONDS = 0.02
_START_ATTEMPTS = 3


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisProcess(ChildProcess):
    def __init__(self, work_dir: Path, *, persistent: bool = False) -> None:
        super().__init__(STOP_TIMEOUT_SECONDS)  # SIGTERM: Redis flushes its append-only file
        self.work_dir = work_dir
        self.persistent = persistent
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def version(self) -> str:
        out = subprocess.run([self._binary(), "--version"], capture_output=True, text=True, check=True).stdout
        return next((p.split("=", 1)[1] for p in out.split() if p.startswith("v=")), out.strip())

    @staticmethod
    def _binary() -> str:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (run `make redis` or scripts/ensure_redis.sh)")
        return binary

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(_START_ATTEMPTS if self.port == 0 else 1):
            port = self.port or free_port()
            self._spawn(port)
            if self._wait_ready(port):
                self.port = port
                return
            self.stop()
        raise RuntimeError(f"redis-server did not start; see {self.work_dir / 'redis.log'}")

    def _spawn(self, port: int) -> None:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        )
        self._process = subprocess.Popen(
            [
                self._binary(),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *persistence,
                "--dir",
                str(self.work_dir),
                "--logfile",
                str(self.work_dir / "redis.log"),
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=self.own_session,
        )

    def _wait_ready(self, port: int) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            if _answers_ping(port):
                return True
            time.sleep(_POLL_SECONDS)
        return False
