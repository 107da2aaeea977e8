"""`attnstore bench`: runs benchmark suites through `python -m bench <suite>` in the source
checkout the CLI was installed from (the suites are not installed; `make bench-<suite>`
also installs Redis first where a suite compares against it)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from rich.console import Console

# The CLI is installed editable from <repo>/cli/attnstore_cli.
REPOSITORY = Path(__file__).resolve().parents[2]


def available_suites(repository: Path = REPOSITORY) -> list[str]:
    """The suites by the bench/ convention: every folder bench/<suite>/ with a run.py."""
    return sorted(run.parent.name for run in (repository / "bench").glob("*/run.py"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME", help="suites to run (default: all of them)")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")


def _bench(*args: str) -> int:
    return subprocess.call([sys.executable, "-m", "bench", *args], cwd=REPOSITORY)


def run(args: argparse.Namespace, console: Console) -> int:
    suites = available_suites()
    if not suites:
        console.print(f"[red]no benchmarks: {REPOSITORY} is not an attnstore source checkout[/red]")
        return 2
    if args.list:
        return _bench("--list")
    unknown = sorted(set(args.names) - set(suites))
    if unknown:
        console.print(f"[red]unknown suite(s) {', '.join(unknown)}; known: {', '.join(suites)}[/red]")
        return 2
    for name in args.names or suites:
        console.rule(f"bench {name}")
        code = _bench(name)
        if code != 0:
            console.print(f"[red]bench {name} failed (exit code {code})[/red]")
            return code
    return 0
