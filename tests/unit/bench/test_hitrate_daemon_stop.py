"""bench-hitrate's daemon stops on SIGTERM before the replay unwinds, even when the
unwinding hangs (a timed-out run once left its daemon running)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import BENCH_DIR

# A suite whose clean-up hangs after SIGTERM, as an event loop's shutdown can: only the
# handler stopped_on_terminate installs can stop the daemon in time.
SUITE = """
import sys, time
from pathlib import Path
from bench.__main__ import exit_on_terminate
from bench.hitrate.daemon_stop import stopped_on_terminate
from kvstore_daemon.launcher import DaemonProcess

exit_on_terminate()
root = Path(sys.argv[1])
daemon = DaemonProcess(root / "ssd", root, root / "daemon.log",
                       {"dram_capacity_bytes": 1 << 24, "ssd_capacity_bytes": 1 << 24, "max_chunk_bytes": 1 << 20})
daemon.start()
try:
    with stopped_on_terminate(daemon):
        print(daemon.pid, flush=True)
        time.sleep(600)
except SystemExit:
    print("unwinding", flush=True)
    time.sleep(600)
"""


def test_sigterm_stops_the_daemon_while_the_replay_still_unwinds(tmp_path: Path) -> None:
    suite = subprocess.Popen(
        [sys.executable, "-c", SUITE, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=BENCH_DIR.parent
    )
    try:
        assert suite.stdout is not None
        daemon = int(suite.stdout.readline())
        os.kill(daemon, 0)  # running
        suite.send_signal(signal.SIGTERM)
        assert suite.stdout.readline().strip() == "unwinding"  # printed after the handler stopped the daemon
        assert suite.poll() is None  # the suite still hangs in its clean-up
        with pytest.raises(ProcessLookupError):
            os.kill(daemon, 0)  # stopped and reaped by the handler
    finally:
        suite.kill()
        suite.wait()
