"""Waiting for processes to go idle: a real spinning child holds the wait until it stops."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.common import cpu_quiet
from bench.common.cpu_quiet import wait_until_idle

SPIN_THEN_SLEEP = (
    "import time\nend = time.monotonic() + {spin}\nwhile time.monotonic() < end: pass\ntime.sleep(60)"
)


def _child(spin_seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SPIN_THEN_SLEEP.format(spin=spin_seconds)])


def test_an_idle_process_is_waited_for_one_window_only() -> None:
    child = _child(0.0)
    try:
        time.sleep(0.5)  # past the interpreter's start-up
        assert wait_until_idle([child.pid]) < 3 * cpu_quiet.WINDOW_SECONDS
    finally:
        child.kill()
        child.wait()


def test_a_spinning_process_is_waited_for_until_it_stops() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",  # the spinner is a grandchild: descendants count
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {SPIN_THEN_SLEEP.format(spin=1.0)!r}])",
        ]
    )
    try:
        time.sleep(0.3)
        waited = wait_until_idle([parent.pid], timeout_seconds=5.0)
        assert 0.4 < waited < 3.0
    finally:
        for process in cpu_quiet.psutil.Process(parent.pid).children(recursive=True):
            process.kill()
        parent.kill()
        parent.wait()


def test_the_wait_gives_up_at_the_timeout_and_ignores_gone_processes() -> None:
    child = _child(30.0)
    try:
        time.sleep(0.3)
        assert 0.5 <= wait_until_idle([child.pid, 2**22 + 1], timeout_seconds=0.5) < 1.5
    finally:
        child.kill()
        child.wait()
