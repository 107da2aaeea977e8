"""`python -m bench`: suites found by the folder convention, each run through its
`main(argv)`; unknown names refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import BENCH_DIR, main, suites
from bench.peers.install import RECIPES, ensure_peer

SUITES = [
    "batch",
    "daemon",
    "hitrate",
    "load",
    "longctx",
    "modules",
    "peers",
    "pool",
    "restore",
    "reuse",
    "vllm",
]


def test_every_folder_with_a_run_py_is_a_suite_and_common_is_not() -> None:
    assert sorted(suites()) == SUITES
    assert all(about for about in suites().values())  # --list shows each docstring's first sentence
    assert (BENCH_DIR / "common").is_dir() and "common" not in suites()


def test_list_and_unknown_suites(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == SUITES
    assert main(["nope"]) == 2
    assert "unknown suite 'nope'" in capsys.readouterr().err
    assert main([]) == 2


@pytest.mark.parametrize("suite", SUITES)
def test_each_suite_takes_its_arguments_from_argv(suite: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([suite, "--help"])
    assert done.value.code == 0
    assert f"python -m bench {suite}" in capsys.readouterr().out


def _module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=BENCH_DIR.parent, capture_output=True, text=True, check=False
    )


def test_the_command_lines_run_from_the_repository_root() -> None:
    listed = _module("bench", "--list")
    assert listed.returncode == 0 and listed.stdout.split()[0] == SUITES[0]
    peers = _module("bench.peers.install", "--help")  # the vLLM-connector test installs through it
    assert peers.returncode == 0 and "vllm" in peers.stdout
    assert set(RECIPES) == {"lmcache", "mooncake", "vllm"} and callable(ensure_peer)


SUITE_WITH_A_SERVER = """
import subprocess, sys, time
from bench.__main__ import exit_on_terminate
exit_on_terminate()
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
try:
    print(server.pid, flush=True)
    time.sleep(600)
finally:
    server.terminate()
    server.wait()
    print("stopped", flush=True)
"""


def test_sigterm_runs_the_suites_clean_up(tmp_path: Path) -> None:
    """`timeout` sends SIGTERM: the suite's finally blocks stop the servers it started in
    sessions of their own (which the signal does not reach) before it exits."""
    suite = subprocess.Popen(
        [sys.executable, "-c", SUITE_WITH_A_SERVER], stdout=subprocess.PIPE, text=True, cwd=BENCH_DIR.parent
    )
    assert suite.stdout is not None
    server = int(suite.stdout.readline())
    suite.send_signal(signal.SIGTERM)
    assert suite.wait(timeout=60) == 128 + signal.SIGTERM
    assert suite.stdout.read().strip() == "stopped"
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)  # reaped by the suite: no such process
