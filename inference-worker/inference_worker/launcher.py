"""Runs a worker as a child process: for demos, benchmarks and tests
(attnstore.server.process.ServiceProcess with the worker's model and daemon).

Starting takes longer than a daemon's (torch, the model, and on first use of the default
model its conversion), hence the longer readiness deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from attnstore.server.process import ServiceProcess

READY_TIMEOUT_SECONDS = 180.0
STOP_TIMEOUT_SECONDS = 60.0


class WorkerProcess(ServiceProcess):
    def __init__(
        self,
        log_path: Path,
        *,
        model_dir: Path | None = None,
        kvstore_address: str | None = None,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        """`model_dir` None: the default model. `kvstore_address` None: no cache. `settings`
        are worker settings by field name, e.g. {"chunk_tokens": 16}."""
        service_env: dict[str, str] = {}
        if model_dir is not None:
            service_env["model_dir"] = str(model_dir)
        if kvstore_address is not None:
            service_env["kvstore_address"] = kvstore_address
        super().__init__(
            "inference_worker.main",
            "ATTNSTORE_WORKER_",
            log_path,
            settings,
            service_env=service_env,
            ready_timeout_seconds=READY_TIMEOUT_SECONDS,
            stop_timeout_seconds=STOP_TIMEOUT_SECONDS,
        )
        self.model_dir = model_dir
        self.kvstore_address = kvstore_address
