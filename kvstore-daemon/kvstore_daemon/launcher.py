"""Runs a daemon as a child process: for the demo, the benchmarks and the tests.

Readiness is the ready file the daemon writes with its bound port, polled with a
deadline (never a fixed sleep). `restart()` and `kill9()` keep the SSD and shm
directories and reuse the bound port, so clients reconnect unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

READY_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 20.0
_POLL_SECONDS = 0.02
_PREFIX = "ATTNSTORE_DAEMON_"


class DaemonProcess:
    def __init__(
        self, ssd_dir: Path, shm_dir: Path, log_path: Path, settings: Mapping[str, object] | None = None
    ) -> None:
        """`settings` are daemon settings by field name, e.g. {"dram_capacity_bytes": 1 << 26}."""
        self.ssd_dir = ssd_dir
        self.shm_dir = shm_dir
        self.log_path = log_path
        self.ready_file = log_path.with_name(log_path.stem + ".ready")
        self.port = 0
        self._settings = {f"{_PREFIX}{name.upper()}": str(value) for name, value in (settings or {}).items()}
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _env(self) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items() if not name.startswith(_PREFIX)}
        env.update(
            {
                f"{_PREFIX}LISTEN_ADDRESS": f"127.0.0.1:{self.port}",
                f"{_PREFIX}SSD_DIRS": json.dumps([str(self.ssd_dir)]),
                f"{_PREFIX}SHM_DIR": str(self.shm_dir),
                f"{_PREFIX}READY_FILE": str(self.ready_file),
                f"{_PREFIX}LOG_JSON": "false",
            }
        )
        env.update(self._settings)
        return env

    def start(self) -> None:
        self.ready_file.unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "kvstore_daemon.main"], env=self._env(), stdout=log, stderr=log
            )
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not self.ready_file.exists():
            if self._process.poll() is not None:
                code, self._process = self._process.returncode, None
                raise RuntimeError(f"daemon exited with {code}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill9()
                raise RuntimeError(f"daemon not ready after {READY_TIMEOUT_SECONDS}s:\n{self.log_tail()}")
            time.sleep(_POLL_SECONDS)
        self.port = int(self.ready_file.read_text())

    def stop(self) -> int | None:
        """SIGTERM and wait for the graceful exit (SIGKILL past the timeout); the exit code."""
        if self._process is None:
            return None
        process, self._process = self._process, None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
        return process.wait()

    def kill9(self) -> None:
        """Kills the daemon without letting it clean up (a crash)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
