"""A real daemon process per test: port 0, its own SSD directory, its arena in a private
directory under /dev/shm, readiness awaited through the ready file (never a sleep)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

READY_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 20.0
_POLL_SECONDS = 0.02
MiB = 1024 * 1024


class DaemonProcess:
    """A `python -m kvstore_daemon.main` subprocess. `restart()` and `kill9()` keep the SSD
    and shm directories and, once a port is bound, reuse it: clients reconnect unchanged."""

    def __init__(self, ssd_dir: Path, shm_dir: Path, log_path: Path, settings: dict[str, str]) -> None:
        self.ssd_dir = ssd_dir
        self.shm_dir = shm_dir
        self.log_path = log_path
        self.ready_file = log_path.with_name("daemon.ready")
        self.port = 0
        self._settings = settings
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items() if not name.startswith("ATTNSTORE_DAEMON_")}
        env.update(
            ATTNSTORE_DAEMON_LISTEN_ADDRESS=f"127.0.0.1:{self.port}",
            ATTNSTORE_DAEMON_SSD_DIRS=json.dumps([str(self.ssd_dir)]),
            ATTNSTORE_DAEMON_SHM_DIR=str(self.shm_dir),
            ATTNSTORE_DAEMON_READY_FILE=str(self.ready_file),
            ATTNSTORE_DAEMON_LOG_JSON="false",
        )
        env.update(self._settings)
        return env

    def start(self) -> None:
        self.ready_file.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "kvstore_daemon.main"], env=self._env(), stdout=log, stderr=log
            )
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not self.ready_file.exists():
            if self._process.poll() is not None:
                raise RuntimeError(f"daemon exited with {self._process.returncode}:\n{self.log_tail()}")
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
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Starts daemons with extra settings, e.g. `daemon_factory(DRAM_CAPACITY_BYTES=...)`
    (names without the ATTNSTORE_DAEMON_ prefix); all are stopped at teardown."""
    started: list[DaemonProcess] = []
    shm_root = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    shm_dirs: list[Path] = []

    def start(**settings: object) -> DaemonProcess:
        index = len(started)
        shm_dir = Path(tempfile.mkdtemp(prefix="attnstore-test-", dir=shm_root))
        shm_dirs.append(shm_dir)
        defaults = {
            "DRAM_CAPACITY_BYTES": 64 * MiB,
            "SSD_CAPACITY_BYTES": 256 * MiB,
            "MAX_CHUNK_BYTES": 16 * MiB,
        }
        merged = {f"ATTNSTORE_DAEMON_{name}": str(value) for name, value in {**defaults, **settings}.items()}
        (tmp_path / f"daemon{index}").mkdir()
        process = DaemonProcess(
            ssd_dir=tmp_path / f"daemon{index}" / "ssd",
            shm_dir=shm_dir,
            log_path=tmp_path / f"daemon{index}" / "daemon.log",
            settings=merged,
        )
        started.append(process)
        process.start()
        return process

    try:
        yield start
    finally:
        for process in started:
            process.stop()
        for shm_dir in shm_dirs:
            shutil.rmtree(shm_dir, ignore_errors=True)


@pytest.fixture
def daemon(daemon_factory: Callable[..., DaemonProcess]) -> DaemonProcess:
    return daemon_factory()
