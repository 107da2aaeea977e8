"""Worker processes for a test module or test, by name, each on a free loopback port:
shared by the DistAttention tests (peers started first, then the workers that name them;
tests/ is on sys.path through the root conftest)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from inference_worker.launcher import WorkerProcess


@contextmanager
def running_workers(
    root: Path, model_dir: Path, settings_by_name: Mapping[str, Mapping[str, object]]
) -> Iterator[dict[str, WorkerProcess]]:
    """Started workers (logs `root/<name>.log`) with their settings; stopped on exit, those
    a test already stopped left alone."""
    started: dict[str, WorkerProcess] = {}
    try:
        for name, settings in settings_by_name.items():
            started[name] = WorkerProcess(root / f"{name}.log", model_dir=model_dir,
                                          settings={"listen_address": "127.0.0.1:0", **settings})  # fmt: skip
            started[name].start()
        yield started
    finally:
        for worker in started.values():
            if worker.running:
                worker.stop()
