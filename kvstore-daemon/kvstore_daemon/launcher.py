"""Runs a daemon as a child process: for the demo, the benchmarks and the tests
(attnstore.server.process.ServiceProcess with the daemon's directories).

`restart()` and `kill9()` keep the SSD and shm directories and reuse the bound port, so
clients reconnect unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from attnstore.server.process import ServiceProcess


class DaemonProcess(ServiceProcess):
    def __init__(
        self, ssd_dir: Path, shm_dir: Path, log_path: Path, settings: Mapping[str, object] | None = None
    ) -> None:
        """`settings` are daemon settings by field name, e.g. {"dram_capacity_bytes": 1 << 26}."""
        super().__init__(
            "kvstore_daemon.main",
            "ATTNSTORE_DAEMON_",
            log_path,
            settings,
            service_env={"ssd_dirs": json.dumps([str(ssd_dir)]), "shm_dir": str(shm_dir)},
        )
        self.ssd_dir = ssd_dir
        self.shm_dir = shm_dir
