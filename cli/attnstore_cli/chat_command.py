"""`attnstore chat`: a multi-turn conversation in the terminal against a running stack,
the answer streamed as it is generated, then the turn's TTFT and KV reuse."""

from __future__ import annotations

import argparse

import grpc
from rich.console import Console

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AttnStoreClient
from attnstore_cli.scheduler_address import add_connection_arguments, client_credentials, scheduler_address
from attnstore_cli.turn_display import reuse_summary

HELP = "/new starts a new conversation, /quit (or Ctrl-D) ends"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    parser.add_argument("--system", default="You are a helpful, concise assistant.", help="system prompt")
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens per answer")
    parser.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature; default greedy"
    )


def run(args: argparse.Namespace, console: Console) -> int:
    address = scheduler_address(args)
    with AttnStoreClient(address, args.api_key, credentials=client_credentials(args)) as client:
        session_id = _new_session(client, args, console)
        console.print(f"[dim]connected to {address}; {HELP}[/dim]")
        while True:
            try:
                message = console.input("[bold green]you>[/bold green] ").strip()
            except EOFError:
                console.print()
                return 0
            if message == "/quit":
                return 0
            if message == "/new":
                session_id = _new_session(client, args, console)
                continue
            if message:
                _turn(client, session_id, message, args, console)


def _new_session(client: AttnStoreClient, args: argparse.Namespace, console: Console) -> str:
    session = client.create_session(system_prompt=args.system)
    console.print(f"[dim]session {session.session_id}[/dim]")
    return session.session_id


def _turn(
    client: AttnStoreClient, session_id: str, message: str, args: argparse.Namespace, console: Console
) -> None:
    console.print("[bold blue]assistant>[/bold blue] ", end="")
    try:
        for event in client.stream_chat(
            session_id, message, max_tokens=args.max_tokens, temperature=args.temperature
        ):
            if isinstance(event, api.TurnStats):
                console.print(f"\n[dim]{reuse_summary(event)}[/dim]")
            else:
                console.print(event.text, end="", markup=False, highlight=False)
    except grpc.RpcError as exc:
        console.print(f"\n[red]{exc.code().name}: {exc.details()}[/red]")
