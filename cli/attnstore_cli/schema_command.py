"""`attnstore schema add FILE | list | delete NAME`: a tenant's PML schemas of prompt modules
on a running stack (docs/prompt-modules.md). `add` shows each module as a worker encodes it."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import grpc
from rich.console import Console
from rich.table import Table

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AttnStoreClient
from attnstore_cli.scheduler_address import add_connection_arguments, client_credentials, scheduler_address


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="register (or replace) the schema in FILE")
    add.add_argument("file", type=Path, help="a PML schema document (<schema name=...>)")
    actions.add_parser("list", help="the tenant's schemas")
    delete = actions.add_parser("delete", help="remove a schema")
    delete.add_argument("name", help="the schema's name")


def run(args: argparse.Namespace, console: Console) -> int:
    with AttnStoreClient(
        scheduler_address(args), args.api_key, credentials=client_credentials(args)
    ) as client:
        try:
            if args.action == "add":
                return _add(client, args.file.read_text(encoding="utf-8"), console)
            if args.action == "list":
                console.print(_table(client.list_schemas()))
                return 0
            if client.delete_schema(args.name):
                console.print(f"deleted schema {args.name}")
                return 0
            console.print(f"[red]no schema {args.name}[/red]")
            return 1
        except grpc.RpcError as exc:
            console.print(f"[red]{exc.code().name}: {exc.details()}[/red]")
            return 1


def _add(client: AttnStoreClient, document: str, console: Console) -> int:
    for event in client.stream_register_schema(document):
        if isinstance(event, api.SchemaEncodeProgress):
            how = "encoded" if event.encoded else "already stored"
            console.print(f"[dim]{event.done}/{event.total} {event.module}: {how}[/dim]")
        else:
            console.print(
                f"registered schema {event.name} ({event.modules} modules, digest {event.digest[:16]})"
            )
    return 0


def _table(schemas: list[api.SchemaInfo]) -> Table:
    table = Table("name", "modules", "bytes", "digest", "registered (UTC)")
    for schema in schemas:
        when = datetime.fromtimestamp(schema.registered_at_unix_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(schema.name, str(schema.modules), str(schema.document_bytes), schema.digest[:16], when)
    return table
