"""A replay's daemon stops the moment a time limit's SIGTERM arrives, before the replay
unwinds. A run timed out under load (`timeout` around `bench hitrate`, its daemon stalled)
once left the daemon running with no parent. Not reproduced since: at load 6-8, SIGTERM
mid-replay (from `timeout` or to the suite alone) unwinds through run_one's `finally`,
which stops the daemon. But that unwinding goes through the event loop's shutdown, which
cancels gRPC calls into a daemon that may itself be stalled, and a caller that gives up
on it with SIGKILL leaves the daemon to its parent watch's graceful stop; a daemon
stopped first leaves nothing to wait for."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from attnstore.server.child_process import ChildProcess


@contextmanager
def stopped_on_terminate(child: ChildProcess) -> Iterator[None]:
    """While inside, SIGTERM stops `child` (gracefully, SIGKILL past its stop timeout),
    then does what the handler before did (the suite's: SystemExit)."""
    previous = signal.getsignal(signal.SIGTERM)

    def terminate(signum: int, frame: FrameType | None) -> None:
        child.stop()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
