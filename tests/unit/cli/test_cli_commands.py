"""The CLI's pure parts: session-store choice, state file, benchmark discovery, parsing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnstore.api.v1 import api_pb2 as api
from attnstore_cli import local_stack
from attnstore_cli.bench_command import available_suites
from attnstore_cli.local_stack import StackError, choose_session_store
from attnstore_cli.main import build_parser
from attnstore_cli.stack_state import StackState
from attnstore_cli.turn_display import reuse_summary


def test_session_store_auto_follows_redis_server_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_stack.shutil, "which", lambda name: None)
    assert choose_session_store("auto", None) == "embedded"
    assert choose_session_store("auto", "redis://example:6379/0") == "redis"
    with pytest.raises(StackError, match="redis-server is not installed"):
        choose_session_store("redis", None)
    monkeypatch.setattr(local_stack.shutil, "which", lambda name: "/usr/bin/redis-server")
    assert choose_session_store("auto", None) == "redis"
    assert choose_session_store("embedded", None) == "embedded"


def _state(pid: int, tmp_path: Path) -> StackState:
    return StackState(
        scheduler_address="127.0.0.1:1",
        daemon_address="127.0.0.1:2",
        worker_addresses=["127.0.0.1:3"],
        session_store="embedded",
        data_dir=tmp_path,
        logs_dir=tmp_path,
        shm_dir=tmp_path,
        pid=pid,
    )


def test_state_file_is_read_only_while_its_process_lives(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ATTNSTORE_HOME", str(tmp_path))
    assert StackState.read() is None
    _state(os.getpid(), tmp_path).write()
    assert StackState.read() == _state(os.getpid(), tmp_path)
    _state(2**22 + 12345, tmp_path).write()  # above Linux's pid_max default: no such process
    assert StackState.read() is None
    StackState.path().write_text("{not json")
    assert StackState.read() is None
    StackState.remove()
    assert not StackState.path().exists()


def test_benchmark_suites_are_the_bench_folders_with_a_run_py(tmp_path: Path) -> None:
    for folder, files in {
        "daemon": ["run.py"],
        "load": ["run.py", "stack.py"],
        "common": ["harness.py"],
    }.items():
        (tmp_path / "bench" / folder).mkdir(parents=True)
        for name in files:
            (tmp_path / "bench" / folder / name).write_text("")
    assert available_suites(tmp_path) == ["daemon", "load"]
    assert available_suites(tmp_path / "missing") == []
    assert {"daemon", "reuse", "hitrate", "load", "peers"} <= set(available_suites())  # the repository's own


def test_reuse_summary_names_ttft_and_reuse() -> None:
    stats = api.TurnStats(
        prompt_tokens=800, reused_tokens=600, generated_tokens=8, ttft_ms=90.4, worker_ttft_ms=80.2
    )
    assert (
        reuse_summary(stats)
        == "TTFT 90 ms (worker 80 ms) · reused 600 of 800 prompt tokens (75%) · 8 generated"
    )
    stats.attempts, stats.truncated_tokens = 2, 256
    assert reuse_summary(stats).endswith("· 256 oldest tokens truncated · 2 attempts")


def test_parser_knows_every_command() -> None:
    parser = build_parser()
    assert parser.parse_args(["up", "--session-store", "embedded", "--port", "0"]).port == 0
    assert parser.parse_args(["demo", "--turns", "2"]).turns == 2
    assert parser.parse_args(["bench", "daemon", "reuse"]).names == ["daemon", "reuse"]
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--session-store", "memcached"])
