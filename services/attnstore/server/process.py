"""Runs a service as a child process: for demos, benchmarks and tests.

The child is `python -m <module>` configured only through its environment variables
(`<env_prefix>*`; the parent's own ones with that prefix are dropped). Readiness is the
ready file the service writes with its bound port once it serves, polled with a
deadline (never a fixed sleep). The first start binds port 0; `restart()` reuses the
bound port, so clients reconnect unchanged. The child watches a pipe whose only write
end the parent holds, so it stops when the parent dies, however it died.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from attnstore.server.child_process import ChildProcess

READY_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 20.0
_POLL_SECONDS = 0.02


class ServiceProcess(ChildProcess):
    def __init__(
        self,
        module: str,
        env_prefix: str,
        log_path: Path,
        settings: Mapping[str, object] | None = None,
        *,
        service_env: Mapping[str, str] | None = None,
        ready_timeout_seconds: float = READY_TIMEOUT_SECONDS,
        stop_timeout_seconds: float = STOP_TIMEOUT_SECONDS,
    ) -> None:
        """`settings` and `service_env` are settings by field name without `env_prefix`
        (e.g. {"log_level": "DEBUG"}; a nested one such as {"tls": {...}} goes as JSON);
        `settings` win. The log goes to `log_path`, the ready file beside it."""
        super().__init__(stop_timeout_seconds)
        self.module = module
        self.env_prefix = env_prefix
        self.log_path = log_path
        self.ready_file = log_path.with_name(log_path.stem + ".ready")
        self.port = 0
        self.metrics_port: int | None = None  # the bound one: a service told metrics_port=0 picks it
        self.ready_timeout_seconds = ready_timeout_seconds
        self._service_env = self._prefixed(service_env or {})
        self._settings = self._prefixed(settings or {})
        self._watch_write_fd: int | None = None

    def _prefixed(self, settings: Mapping[str, object]) -> dict[str, str]:
        return {f"{self.env_prefix}{name.upper()}": _env_value(value) for name, value in settings.items()}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items() if not name.startswith(self.env_prefix)}
        env.update(
            {
                f"{self.env_prefix}LISTEN_ADDRESS": f"127.0.0.1:{self.port}",
                f"{self.env_prefix}READY_FILE": str(self.ready_file),
                f"{self.env_prefix}LOG_JSON": "false",
            }
        )
        env.update(self._service_env)
        env.update(self._settings)
        if self.metrics_port is not None:  # a restart keeps the metrics port bound first, as the gRPC one
            env[f"{self.env_prefix}METRICS_PORT"] = str(self.metrics_port)
        return env

    def start(self) -> None:
        self.ready_file.unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._close_watch()
        # Both ends are non-inheritable: only this child gets the read end, no child the write end.
        watch_read_fd, self._watch_write_fd = os.pipe()
        env = {**self._env(), f"{self.env_prefix}PARENT_WATCH_FD": str(watch_read_fd)}
        try:
            with self.log_path.open("ab") as log:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", self.module],
                    env=env,
                    stdout=log,
                    stderr=log,
                    pass_fds=(watch_read_fd,),
                    start_new_session=self.own_session,
                )
        finally:
            os.close(watch_read_fd)
        deadline = time.monotonic() + self.ready_timeout_seconds
        while not self.ready_file.exists():
            if self._process.poll() is not None:
                code, self._process = self._process.returncode, None
                self._close_watch()
                raise RuntimeError(f"{self.module} exited with {code}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill9()
                raise RuntimeError(
                    f"{self.module} not ready after {self.ready_timeout_seconds}s:\n{self.log_tail()}"
                )
            time.sleep(_POLL_SECONDS)
        ready = json.loads(self.ready_file.read_text())
        self.port, self.metrics_port = int(ready["port"]), ready["metrics_port"]

    def stop(self) -> int | None:
        try:
            return super().stop()
        finally:
            self._close_watch()

    def kill9(self) -> None:
        super().kill9()
        self._close_watch()

    def _close_watch(self) -> None:
        if self._watch_write_fd is not None:
            os.close(self._watch_write_fd)
            self._watch_write_fd = None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _env_value(value: object) -> str:
    """Mappings and lists as the JSON the settings parse, anything else as its text."""
    return json.dumps(value, default=str) if isinstance(value, Mapping | list) else str(value)
