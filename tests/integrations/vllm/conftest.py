"""vLLM CPU for the connector's end-to-end tests: its own cached venv (never the project's:
their pins clash), one engine process per test module driven over stdin/stdout
(vllm_driver.py), and the attnstore packages reached through PYTHONPATH.

`vllm_python()` gets vLLM from bench/vllm/vllm_env.py, the one place that installs it
(with bench's peer installer, `ensure_peer("vllm")`)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from running_daemon import running_daemon

from bench.vllm.vllm_env import VllmUnavailable, connector_env, ensure_vllm
from kvstore_daemon.launcher import DaemonProcess

ROOT = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).with_name("vllm_driver.py")
RESULT_PREFIX = "ATTNSTORE-DRIVER "
MiB = 1024 * 1024


def vllm_python() -> tuple[Path, dict[str, str]]:
    """vLLM CPU's python and the environment its processes run in (bench/vllm/vllm_env.py)."""
    try:
        peer = ensure_vllm()
    except VllmUnavailable as exc:
        pytest.fail(f"vLLM CPU could not be installed: {exc}")
    assert peer.python is not None
    env = {
        **connector_env(peer),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in the driver's process: its counters too
        "VLLM_CPU_OMP_THREADS_BIND": "all",
    }
    return peer.python, env


class VllmEngine:
    """One vLLM engine in a child process of vLLM's venv; `call` sends a command, waits for its reply."""

    def __init__(
        self,
        python: Path,
        env: dict[str, str],
        model_dir: Path,
        log_path: Path,
        *,
        block_size: int,
        kv_cache_bytes: int,
        kv_transfer_config: dict[str, Any] | None = None,
    ) -> None:
        command = [
            str(python),
            str(DRIVER),
            "--model",
            str(model_dir),
            "--block-size",
            str(block_size),
            "--kv-cache-bytes",
            str(kv_cache_bytes),
        ]
        if kv_transfer_config is not None:
            command += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
        self.log_path = log_path
        self._log = log_path.open("wb")
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )

    def wait_ready(self) -> None:
        """Returns once the engine has started (engines start side by side, then wait)."""
        self._read()

    def call(self, **command: Any) -> dict[str, Any]:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        return self._read()

    def _read(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith(RESULT_PREFIX):
                return json.loads(line[len(RESULT_PREFIX) :])
            self._log.write(line.encode())  # vLLM logs to stdout
            self._log.flush()
        tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"the vLLM driver exited ({self._process.wait()}):\n{tail}")

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A real daemon per test module (tests/running_daemon.py)."""
    with running_daemon(
        tmp_path_factory.mktemp("daemon"), dram_bytes=64 * MiB, ssd_bytes=256 * MiB
    ) as process:
        yield process


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory):
    """`vllm_engine(model_dir, name, **VllmEngine options)`: a started-not-ready engine; all
    are closed at the end of the session."""
    python, env = vllm_python()
    logs = tmp_path_factory.mktemp("vllm-logs")
    engines: list[VllmEngine] = []

    def start(model_dir: Path, name: str, **options: Any) -> VllmEngine:
        engines.append(VllmEngine(python, env, model_dir, logs / f"{name}.log", **options))
        return engines[-1]

    yield start
    for engine in engines:
        engine.close()
