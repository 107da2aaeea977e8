"""Which stack a client command talks to, and how: flags first, then the running
`attnstore up`, then the scheduler's default local address; TLS when a CA file is given."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from attnstore.api_client import ClientCredentials
from attnstore.security.credentials import SecurityConfigError, read_secret_file
from attnstore.server.ports import SCHEDULER_PORT
from attnstore_cli.stack_state import StackState

DEFAULT_SCHEDULER_ADDRESS = f"127.0.0.1:{SCHEDULER_PORT}"


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
    parser.add_argument(
        "--ca-file", type=Path, default=None, help="PEM CA bundle of a scheduler serving TLS (turns TLS on)"
    )
    parser.add_argument("--cert-file", type=Path, default=None, help="client certificate, for mutual TLS")
    parser.add_argument("--key-file", type=Path, default=None, help="its private key")


def scheduler_address(args: argparse.Namespace) -> str:
    if args.address:
        return str(args.address)
    state = StackState.read()
    return state.scheduler_address if state is not None else DEFAULT_SCHEDULER_ADDRESS


def client_credentials(args: argparse.Namespace) -> ClientCredentials | None:
    """TLS credentials from --ca-file (and --cert-file/--key-file); None: plaintext. Raises
    SecurityConfigError naming an unreadable file."""
    if args.ca_file is None:
        if args.cert_file is not None or args.key_file is not None:
            raise SecurityConfigError("--cert-file and --key-file need --ca-file (TLS)")
        return None
    if (args.cert_file is None) != (args.key_file is None):
        raise SecurityConfigError("--cert-file and --key-file go together")
    return ClientCredentials.from_pem(
        read_secret_file(args.ca_file, "--ca-file"),
        certificate_chain=read_secret_file(args.cert_file, "--cert-file") if args.cert_file else None,
        private_key=read_secret_file(args.key_file, "--key-file") if args.key_file else None,
    )
