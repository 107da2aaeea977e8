"""`python -m bench <suite> [options]` runs one benchmark suite; `python -m bench --list`
lists them. The Makefile's `bench-<suite>` targets and `attnstore bench` call it.

A suite is a folder `bench/<suite>/` whose `run.py` defines `main(argv: list[str] | None)`:
adding such a folder adds a suite (`bench/common/` has no run.py and is none). Suites are
found by reading the folders, not by importing them (a suite may import torch).

SIGTERM (what `timeout` sends) ends a suite as an exception would: its `finally` blocks
stop the servers it started (vLLM, the local stacks), which run in sessions of their own
that the signal does not reach; before, a suite stopped by `timeout` left them running.
SIGKILL cannot be handled: there they stay."""

from __future__ import annotations

import ast
import importlib
import signal
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
USAGE = "usage: python -m bench SUITE [suite options]   (python -m bench SUITE --help; --list)"


def suites() -> dict[str, str]:
    """Suite name -> the first sentence of its run.py's docstring."""
    return {run.parent.name: _summary(run) for run in sorted(BENCH_DIR.glob("*/run.py"))}


def _summary(run: Path) -> str:
    doc = ast.get_docstring(ast.parse(run.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")


def exit_on_terminate() -> None:
    """SIGTERM raises SystemExit in the main thread; a second one during the clean-up is ignored."""

    def terminate(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    known = suites()
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] == "--list":
        for name, about in known.items():
            print(f"{name:<10} {about}")
        return 0
    suite, rest = args[0], args[1:]
    if suite not in known:
        print(f"unknown suite {suite!r}; suites: {', '.join(known)}", file=sys.stderr)
        return 2
    sys.argv[0] = f"python -m bench {suite}"  # the suite's --help names the command (argparse's prog)
    exit_on_terminate()
    importlib.import_module(f"bench.{suite}.run").main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
