"""A private redis-server for the benchmark: loopback, a free port, no persistence.

Readiness is a successful PING polled with a deadline, never a fixed sleep. The port is
picked by binding port 0 and releasing it, so another process may grab it first: the
start is retried on a new port when the server exits before answering.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

READY_TIMEOUT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 10.0
_POLL_SECONDS = 0.02
_START_ATTEMPTS = 3


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def version(self) -> str:
        out = subprocess.run([self._binary(), "--version"], capture_output=True, text=True, check=True).stdout
        return next((p.split("=", 1)[1] for p in out.split() if p.startswith("v=")), out.strip())

    @staticmethod
    def _binary() -> str:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (run `make redis`)")
        return binary

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(_START_ATTEMPTS):
            self.port = _free_port()
            self._process = subprocess.Popen(
                [
                    self._binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--dir", str(self.work_dir),
                    "--logfile", str(self.work_dir / "redis.log"), "--daemonize", "no",
                ],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            if self._wait_ready():
                return
            self.stop()
        raise RuntimeError(f"redis-server did not start; see {self.work_dir / 'redis.log'}")

    def _wait_ready(self) -> bool:
        assert self._process is not None
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1.0)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        try:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.ConnectionError:
                    time.sleep(_POLL_SECONDS)
            return False
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL past the timeout."""
        if self._process is None:
            return
        process, self._process = self._process, None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
