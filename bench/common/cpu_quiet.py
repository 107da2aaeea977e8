"""Waiting until processes stop using the CPU, so that one system's leftover work is not
billed to the next request of another on a shared 2-core machine.

Why: vLLM's worker process busy-polls its shared-memory message queue for a second after
every step (vllm/distributed/device_communicators/shm_broadcast.py, `SpinCondition`,
`busy_loop_s=1`, no setting to change it), holding one of the two cores. A request sent to
attnstore right after a vLLM turn ran on one core for its first second: measured 1.4x
slower than the same turns with vLLM idle. The serving comparison waits, before every
timed request, until both systems' processes are idle.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import psutil

WINDOW_SECONDS = 0.1
IDLE_CORE_FRACTION = 0.05  # used less than this share of one core over a window: idle
TIMEOUT_SECONDS = 10.0


def _cpu_seconds(roots: list[psutil.Process]) -> float:
    """User + system CPU seconds of the processes and all their descendants alive now."""
    total = 0.0
    for root in roots:
        try:
            family = [root, *root.children(recursive=True)]
        except psutil.Error:  # exited: nothing of it can be busy
            continue
        for process in family:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total


def wait_until_idle(pids: Iterable[int], timeout_seconds: float = TIMEOUT_SECONDS) -> float:
    """Blocks until the processes and their descendants use under IDLE_CORE_FRACTION of a
    core over one WINDOW_SECONDS window (at most `timeout_seconds`); the seconds waited."""
    roots = []
    for pid in pids:
        try:
            roots.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    started = time.monotonic()
    before = _cpu_seconds(roots)
    while time.monotonic() - started < timeout_seconds:
        time.sleep(WINDOW_SECONDS)
        after = _cpu_seconds(roots)
        if after - before < IDLE_CORE_FRACTION * WINDOW_SECONDS:
            break
        before = after
    return time.monotonic() - started
