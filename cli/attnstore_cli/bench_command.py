"""`attnstore bench`: runs benchmarks through their Makefile targets (`make bench-<name>`),
which install what each needs; needs the source checkout the CLI was installed from."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

from rich.console import Console

# The CLI is installed editable from <repo>/cli/attnstore_cli.
REPOSITORY = Path(__file__).resolve().parents[2]
_TARGET = re.compile(r"^bench-([a-z0-9-]+):.*?(?:##\s*(.*))?$", re.MULTILINE)


def available_benchmarks(makefile: Path = REPOSITORY / "Makefile") -> dict[str, str]:
    """Benchmark name -> what it measures, from the Makefile's `bench-*` targets."""
    if not makefile.is_file():
        return {}
    return {name: (about or "").strip() for name, about in _TARGET.findall(makefile.read_text())}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all of them)")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")


def run(args: argparse.Namespace, console: Console) -> int:
    benchmarks = available_benchmarks()
    if not benchmarks:
        console.print(f"[red]no benchmarks: {REPOSITORY} is not an attnstore source checkout[/red]")
        return 2
    if args.list:
        for name, about in benchmarks.items():
            console.print(f"[bold]{name}[/bold]  {about}")
        return 0
    unknown = sorted(set(args.names) - set(benchmarks))
    if unknown:
        console.print(f"[red]unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(benchmarks)}[/red]")
        return 2
    for name in args.names or list(benchmarks):
        console.rule(f"bench-{name}")
        code = subprocess.call(["make", "-C", str(REPOSITORY), f"bench-{name}"])
        if code != 0:
            console.print(f"[red]bench-{name} failed (exit code {code})[/red]")
            return code
    return 0
