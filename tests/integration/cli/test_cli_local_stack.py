"""The `attnstore` command against real processes: `up` starts the whole stack (daemon,
worker on a tiny model, scheduler, and Redis or the embedded store), `status` and `chat`
find it through the state file, Ctrl-C stops everything and leaves no process and no
shared memory behind; `demo` (what `make run` runs) walks its conversation."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from attnstore_cli.stack_state import StackState

ATTNSTORE = [sys.executable, "-m", "attnstore_cli.main"]
SMALL_TIERS = ["--dram-gib", "0.0625", "--ssd-gib", "0.25"]
START_TIMEOUT_SECONDS = 180.0
# ~600 tiny-tokenizer tokens: two full 256-token chunks for the next turn to reuse.
LONG_MESSAGE = "the capital of france is paris, hello world, how are you? " * 40


@pytest.fixture(scope="module")
def cli_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path]) -> Path:
    return tiny_model_saver(tmp_path_factory.mktemp("cli-model") / "model", max_position_embeddings=8192)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of the CLI processes: a private ATTNSTORE_HOME (state file, data)."""
    monkeypatch.setenv("ATTNSTORE_HOME", str(tmp_path / "home"))
    return {**os.environ, "ATTNSTORE_HOME": str(tmp_path / "home")}


def _stack_flags(model_dir: Path, session_store: str) -> list[str]:
    return ["--model-dir", str(model_dir), "--session-store", session_store, *SMALL_TIERS]


def _attnstore(
    args: list[str], env: dict[str, str], *, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ATTNSTORE, *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def _running_up(
    model_dir: Path, session_store: str, env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`attnstore up` in the background; killed at the block's end if it still runs."""
    with log.open("wb") as out:
        up = subprocess.Popen(
            [*ATTNSTORE, "up", *_stack_flags(model_dir, session_store), "--port", "0", "--openai-port", "0"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, like a job in a terminal
        )
    try:
        yield up
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


@pytest.fixture(autouse=True)
def _ctrl_c_reaches_up() -> Iterator[None]:
    """`up` stops on Ctrl-C (SIGINT). A run started as a background job inherits SIGINT
    ignored, and an ignored signal stays ignored across exec (a handler does not): with a
    handler here, `up` starts with SIGINT at its default, as from a terminal."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _wait_for_state(up: subprocess.Popen[bytes], log: Path) -> StackState:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while (state := StackState.read()) is None:
        assert up.poll() is None, f"attnstore up exited with {up.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"attnstore up not ready:\n{log.read_text()}"
        time.sleep(0.1)
    return state


@pytest.mark.parametrize("session_store", ["embedded", "redis"])
def test_up_status_chat_and_ctrl_c(
    session_store: str,
    cli_model_dir: Path,
    home: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if session_store == "redis":
        request.getfixturevalue("redis_installed")
    log = tmp_path / "up.log"
    with _running_up(cli_model_dir, session_store, home, log) as up:
        state = _wait_for_state(up, log)
        assert state.session_store == session_store and (state.redis_url is not None) == (
            session_store == "redis"
        )
        children = psutil.Process(up.pid).children(recursive=True)
        assert len(children) == (4 if session_store == "redis" else 3)
        assert state.shm_dir.is_dir()

        status = _attnstore(["status"], home)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("SERVING") == 3 and "DRAM" in status.stdout and "SSD" in status.stdout
        assert (
            "worker kernels" in status.stdout and "sdpa" in status.stdout
        )  # the model's kernels, with reasons

        # The curl line it printed answers from the running stack.
        [curl] = [line for line in log.read_text().splitlines() if line.startswith("curl ")]
        completion = json.loads(subprocess.run(["bash", "-c", curl], capture_output=True, check=True).stdout)
        assert completion["object"] == "chat.completion" and completion["usage"]["completion_tokens"] >= 1

        chat = _attnstore(
            ["chat", "--max-tokens", "4", "--system", "You are terse."],
            home,
            input=f"{LONG_MESSAGE}\nhello world\n/quit\n",
        )
        assert chat.returncode == 0, chat.stdout + chat.stderr
        reused = [
            (int(a), int(b)) for a, b in re.findall(r"reused (\d+) of (\d+) prompt tokens", chat.stdout)
        ]
        assert len(reused) == 2, chat.stdout
        assert reused[0][0] == 0 and reused[1][0] >= 512, reused  # the second turn reuses the first's chunks

        schema = tmp_path / "desk.pml"
        schema.write_text('<schema name="desk">Notes.<module name="doc">paris is in france</module></schema>')
        added = _attnstore(["schema", "add", str(schema)], home)
        assert added.returncode == 0, added.stdout + added.stderr
        assert "1/2 (root): encoded" in added.stdout and "registered schema desk (1 modules" in added.stdout
        listed = _attnstore(["schema", "list"], home)
        assert listed.returncode == 0 and "desk" in listed.stdout, listed.stdout + listed.stderr
        assert _attnstore(["schema", "delete", "desk"], home).returncode == 0
        assert _attnstore(["schema", "delete", "desk"], home).returncode == 1  # gone

        os.killpg(up.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground group
        assert up.wait(60) == 0, log.read_text()
    assert "stopped every service; shared memory removed" in log.read_text()
    assert not any(child.is_running() for child in children)
    assert not state.shm_dir.exists()
    assert StackState.read() is None and not StackState.path().exists()


def test_up_refuses_to_start_twice_and_sigterm_stops_it(
    cli_model_dir: Path, home: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "up.log"
    with _running_up(cli_model_dir, "embedded", home, log) as up:
        state = _wait_for_state(up, log)
        second = _attnstore(["up", "--port", "0"], home)
        assert second.returncode == 1 and "already runs" in second.stdout
        children = psutil.Process(up.pid).children(recursive=True)
        up.terminate()
        assert up.wait(60) == 0, log.read_text()
    assert not any(child.is_running() for child in children)
    assert not state.shm_dir.exists()


def test_demo_walks_the_conversation_with_reuse(cli_model_dir: Path, home: dict[str, str]) -> None:
    demo = _attnstore(
        ["demo", *_stack_flags(cli_model_dir, "embedded"), "--turns", "3", "--max-tokens", "4"],
        {**home, "COLUMNS": "200"},
        timeout=300,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    reused = [int(n) for n in re.findall(r"reused (\d+) of \d+ prompt tokens", demo.stdout)]
    assert len(reused) == 3 and reused[0] == 0 and min(reused[1:]) > 0, demo.stdout
    assert re.search(
        r"turns 2-3: median TTFT \d+ ms with the conversation's KV reused vs \d+ ms recomputed", demo.stdout
    )
    assert "stopped every service; shared memory removed" in demo.stdout
    assert re.search(r"^curl -s http://127\.0\.0\.1:\d+/v1/chat/completions ", demo.stdout, re.MULTILINE)
