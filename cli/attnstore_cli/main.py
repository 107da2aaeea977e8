"""The `attnstore` command line (entry point)."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from attnstore.security import SecurityConfigError
from attnstore.settings import SettingsError
from attnstore_cli import (
    bench_command,
    chat_command,
    demo_command,
    schema_command,
    status_command,
    up_command,
)
from attnstore_cli.local_stack import StackError

COMMANDS = {
    "up": (
        up_command,
        "start the local stack (Redis or embedded store, daemon, worker, scheduler) until Ctrl-C",
    ),
    "demo": (demo_command, "start the stack, run a multi-turn conversation, compare TTFT with recomputation"),
    "chat": (chat_command, "chat in the terminal with a running stack, showing TTFT and KV reuse per turn"),
    "schema": (schema_command, "PML schemas of prompt modules: add FILE, list, delete NAME"),
    "status": (status_command, "health of every service, the KV store's tiers, capacity and hit rate"),
    "bench": (bench_command, "run the benchmarks (make bench-<name>)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnstore", description="attnstore: a KV-cache service for LLM serving"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, about) in COMMANDS.items():
        module.add_arguments(commands.add_parser(name, help=about, description=about))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(highlight=False)
    try:
        return COMMANDS[args.command][0].run(args, console)
    except (StackError, SettingsError, SecurityConfigError) as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    except RuntimeError as exc:  # a service failed to start: its log tail is in the message
        console.print(f"[red]{exc}[/red]")
        return 1


if __name__ == "__main__":
    sys.exit(main())
