"""What every child process the tools start (a service, Redis) shares: whether it runs,
a graceful stop with a deadline, a crash on demand."""

from __future__ import annotations

import subprocess


class ChildProcess:
    # True: the child runs in its own session, so a terminal's Ctrl-C reaches only the
    # parent, which then stops its children in order (the local stack sets it).
    own_session = False

    def __init__(self, stop_timeout_seconds: float) -> None:
        self.stop_timeout_seconds = stop_timeout_seconds
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        """Started and not exited (False after a crash, too)."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def stop(self) -> int | None:
        """SIGTERM and wait for the graceful exit (SIGKILL past the timeout); the exit code."""
        if self._process is None:
            return None
        process, self._process = self._process, None
        if process.poll() is None:
            process.terminate()
            try:
                return process.wait(self.stop_timeout_seconds)
            except subprocess.TimeoutExpired:
                process.kill()
        return process.wait()

    def kill9(self) -> None:
        """SIGKILL: a crash, nothing cleaned up on the way out; `start()` brings it back."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self) -> None:
        self.stop()
        self.start()
