"""A service started through `ServiceProcess` stops when the process that started it dies,
even by SIGKILL (no chance to stop its children): `attnstore up` killed hard used to leave
its daemon, workers and scheduler running as orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

_DEADLINE_SECONDS = 60.0

_PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from running_daemon import running_daemon

    with running_daemon(Path(sys.argv[1]), dram_bytes=1 << 24, ssd_bytes=1 << 24) as daemon:
        print(daemon.pid, flush=True)
        time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_daemon_stops_gracefully_when_its_parent_is_killed(tmp_path: Path) -> None:
    tests_dir = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests_dir), os.environ.get("PYTHONPATH", "")])},
    )
    assert parent.stdout is not None
    daemon_pid = int(parent.stdout.readline())
    assert _alive(daemon_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + _DEADLINE_SECONDS
    while _alive(daemon_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    log = (tmp_path / "daemon.log").read_text(errors="replace")
    if _alive(daemon_pid):
        os.kill(daemon_pid, signal.SIGKILL)
    assert "parent_process_gone" in log, log[-2000:]
    assert "] stopped" in log, log[-2000:]
