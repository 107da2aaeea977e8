"""Runs a scheduler as a child process: for demos, benchmarks and tests
(attnstore.server.process.ServiceProcess with the scheduler's topology and keys)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from attnstore.server.process import ServiceProcess
from attnstore_scheduler.settings import NodeSpec


class SchedulerProcess(ServiceProcess):
    def __init__(
        self,
        log_path: Path,
        *,
        nodes: Sequence[NodeSpec],
        redis_url: str | None = None,
        api_keys_file: Path | None = None,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        """`redis_url` None: the embedded session store. `api_keys_file` None: no
        authentication (every caller is tenant 'default'). `settings` are scheduler settings
        by field name, e.g. {"session_ttl_seconds": 2}."""
        service_env: dict[str, str] = {"nodes": json.dumps([node.model_dump() for node in nodes])}
        if redis_url is not None:
            service_env["redis_url"] = redis_url
        if api_keys_file is None:
            service_env["auth_enabled"] = "false"
        else:
            service_env["api_keys_file"] = str(api_keys_file)
        super().__init__(
            "attnstore_scheduler.main", "ATTNSTORE_SCHEDULER_", log_path, settings, service_env=service_env
        )
