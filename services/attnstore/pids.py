"""Whether a process id names a live process (pid files, arena owners)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only the existence and permission checks
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by another user
    except OverflowError:
        return False  # no such pid can exist
    return True
