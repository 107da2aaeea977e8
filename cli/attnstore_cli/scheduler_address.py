"""Which stack a client command talks to: flags first, then the running `attnstore up`,
then the scheduler's default local address."""

from __future__ import annotations

import argparse
import os

from attnstore_cli.stack_state import StackState

DEFAULT_SCHEDULER_ADDRESS = "127.0.0.1:50071"


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default=None,
        help=f"scheduler host:port (default: the running `attnstore up`, else {DEFAULT_SCHEDULER_ADDRESS})",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("ATTNSTORE_API_KEY"),
        help="API key (default: $ATTNSTORE_API_KEY; the local stack needs none)",
    )


def scheduler_address(args: argparse.Namespace) -> str:
    if args.address:
        return str(args.address)
    state = StackState.read()
    return state.scheduler_address if state is not None else DEFAULT_SCHEDULER_ADDRESS
