"""`attnstore up`: the local stack in the foreground until Ctrl-C; `attnstore chat` and
`attnstore status` find it through the state file."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from attnstore.server.ports import SCHEDULER_PORT
from attnstore_cli.stack_arguments import add_stack_arguments, running_stack, stack_spec
from attnstore_cli.stack_state import StackState, attnstore_home

WATCH_INTERVAL_SECONDS = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_stack_arguments(parser)
    parser.add_argument(
        "--port", type=int, default=SCHEDULER_PORT, help="the scheduler's port (the public API)"
    )
    parser.add_argument(
        "--openai-port",
        type=int,
        default=8000,
        help="the OpenAI-compatible HTTP API's port; 0 picks a free one",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="SSD tier, Redis files and logs; kept across runs (default: $ATTNSTORE_HOME/data)",
    )


def run(args: argparse.Namespace, console: Console) -> int:
    if (running := StackState.read()) is not None:
        console.print(f"[red]a local stack already runs (pid {running.pid}); stop it first[/red]")
        return 1
    spec = stack_spec(
        args,
        data_dir=args.data_dir or attnstore_home() / "data",
        scheduler_port=args.port,
        openai_port=args.openai_port,
    )
    try:
        with running_stack(spec, console) as (stack, state):
            state.write()
            console.print("try [bold]attnstore chat[/bold] and [bold]attnstore status[/bold]; Ctrl-C stops")
            while not (dead := stack.dead_services()):
                time.sleep(WATCH_INTERVAL_SECONDS)
            console.print(f"[red]{', '.join(dead)} exited on its own; stopping the stack[/red]")
            return 1
    except KeyboardInterrupt:
        return 0
    finally:
        StackState.remove()
