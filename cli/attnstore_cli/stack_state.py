"""Where a running local stack can be reached: written by `attnstore up`, read by
`attnstore chat` and `attnstore status` so they need no flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from attnstore.pids import pid_alive

DEFAULT_HOME = Path("~/.cache/attnstore")
SessionStoreKind = Literal["redis", "embedded"]


def attnstore_home() -> Path:
    """`ATTNSTORE_HOME`, else ~/.cache/attnstore: the local stack's data, logs and state file."""
    return Path(os.environ.get("ATTNSTORE_HOME") or DEFAULT_HOME).expanduser()


class StackState(BaseModel):
    scheduler_address: str
    openai_url: str | None = None  # base URL of the OpenAI-compatible API (".../v1")
    daemon_address: str
    worker_addresses: list[str]
    session_store: SessionStoreKind
    redis_url: str | None = None
    data_dir: Path
    logs_dir: Path
    shm_dir: Path  # the daemon's DRAM arena; removed when the stack stops
    pid: int  # of the `attnstore up` process

    @staticmethod
    def path() -> Path:
        return attnstore_home() / "stack.json"

    def write(self) -> None:
        path = self.path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2))
        os.replace(tmp, path)

    @classmethod
    def read(cls) -> StackState | None:
        """The running stack's state; None when no `attnstore up` runs (or it died)."""
        try:
            state = cls.model_validate_json(cls.path().read_text())
        except (OSError, ValueError):
            return None
        return state if pid_alive(state.pid) else None

    @classmethod
    def remove(cls) -> None:
        cls.path().unlink(missing_ok=True)
