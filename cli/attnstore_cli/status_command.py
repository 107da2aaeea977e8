"""`attnstore status`: is every service of the stack healthy, what is in the KV store
(per tier: chunks, bytes used of capacity, hits; the overall hit rate), and which kernels
each worker's model runs on (and why)."""

from __future__ import annotations

import argparse

import grpc
from rich.console import Console
from rich.table import Table

from attnstore.healthcheck import check
from attnstore.kvstore.v1 import kvstore_pb2
from attnstore.kvstore_client import KVStoreClient
from attnstore.worker.v1 import worker_pb2, worker_pb2_grpc
from attnstore_cli.scheduler_address import scheduler_address
from attnstore_cli.stack_state import StackState

HEALTH_TIMEOUT_SECONDS = 3.0
MiB = 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address", default=None, help="scheduler host:port (default: the running `attnstore up`)"
    )
    parser.add_argument(
        "--daemon",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help="a KV-store daemon to report on (repeatable; default: the running `attnstore up`'s)",
    )
    parser.add_argument(
        "--worker", action="append", default=None, metavar="HOST:PORT", help="a worker (repeatable)"
    )


def run(args: argparse.Namespace, console: Console) -> int:
    state = StackState.read()
    daemons = args.daemon or ([state.daemon_address] if state else [])
    workers = args.worker or (state.worker_addresses if state else [])
    if state is not None:
        console.print(
            f"local stack (pid {state.pid}): sessions in {state.session_store}"
            f"{f' ({state.redis_url})' if state.redis_url else ''}; data in {state.data_dir}; logs in {state.logs_dir}"
        )
    services = [("scheduler", scheduler_address(args))]
    services += [("kvstore-daemon", address) for address in daemons]
    services += [("inference-worker", address) for address in workers]
    health = Table(title="services")
    for column in ("service", "address", "health"):
        health.add_column(column)
    healthy = True
    for name, address in services:
        status = check(address, "", HEALTH_TIMEOUT_SECONDS)
        healthy &= status == "SERVING"
        health.add_row(name, address, f"[{'green' if status == 'SERVING' else 'red'}]{status}[/]")
    console.print(health)
    for address in daemons:
        try:
            with KVStoreClient(address, use_shm=False, timeout_seconds=HEALTH_TIMEOUT_SECONDS) as client:
                stats = client.stats()
                console.print(_tiers_table(address, stats))
                console.print(namespaces_line(stats))
                console.print(policy_line(stats))
        except grpc.RpcError as exc:
            console.print(f"[red]{address}: Stats failed: {exc.code().name}: {exc.details()}[/red]")
            healthy = False
    if workers:
        kernels, healthy_workers = _kernels_table(workers)
        console.print(kernels)
        healthy &= healthy_workers
    return 0 if healthy else 1


def _kernels_table(workers: list[str]) -> tuple[Table, bool]:
    """Each worker's model and the kernels it chose at start (DescribeModel)."""
    table = Table(title="worker kernels")
    for column in ("worker", "model", "device", "cpu", "linear", "attention"):
        table.add_column(column)
    answered = True
    for address in workers:
        try:
            with grpc.insecure_channel(address) as channel:
                card = worker_pb2_grpc.WorkerStub(channel).DescribeModel(
                    worker_pb2.DescribeModelRequest(), timeout=HEALTH_TIMEOUT_SECONDS
                )
        except grpc.RpcError as exc:
            table.add_row(address, f"[red]{exc.code().name}: {exc.details()}[/red]", "", "", "", "")
            answered = False
            continue
        kernels = card.kernels
        table.add_row(
            address,
            f"{card.model_label} ({card.dtype})",
            kernels.device,
            kernels.cpu_capability,
            f"{kernels.linear.kernel}: {kernels.linear.reason}",
            f"{kernels.attention.kernel}: {kernels.attention.reason}",
        )
    return table, answered


def _tiers_table(address: str, stats: kvstore_pb2.StatsResponse) -> Table:
    hits = stats.dram.hits + stats.ssd.hits
    lookups = hits + stats.misses
    rate = f"{hits / lookups:.1%}" if lookups else "no lookups yet"
    table = Table(
        title=f"KV store {address}: policy {stats.eviction_policy}, chunk hit rate {rate} "
        f"({hits} hits, {stats.misses} misses)"
    )
    for column in ("tier", "chunks", "used MiB", "capacity MiB", "used", "hits", "evictions"):
        table.add_column(column, justify="right" if column != "tier" else "left")
    for name, tier in (("DRAM", stats.dram), ("SSD", stats.ssd)):
        used = tier.used_bytes / tier.capacity_bytes if tier.capacity_bytes else 0.0
        table.add_row(
            name,
            str(tier.chunks),
            f"{tier.used_bytes / MiB:.0f}",
            f"{tier.capacity_bytes / MiB:.0f}",
            f"{used:.0%}",
            str(tier.hits),
            str(tier.evictions),
        )
    return table


def policy_line(stats: kvstore_pb2.StatsResponse) -> str:
    """The eviction policy, and what admission declined (predictive: chunks of ended sessions)."""
    return (
        f"eviction policy: {stats.eviction_policy}, {stats.admissions_declined} chunks declined at admission"
    )


def namespaces_line(stats: kvstore_pb2.StatsResponse) -> str:
    """The namespace table's fill, in red once a registration was refused (those tenants'
    KV is neither stored nor reused)."""
    refused = stats.namespaces_refused_table_full + stats.namespaces_refused_rate_limited
    line = (
        f"namespaces: {stats.namespaces} of {stats.max_namespaces}, {stats.namespaces_reclaimed} reclaimed, "
        f"{refused} refused ({stats.namespaces_refused_table_full} table full, "
        f"{stats.namespaces_refused_rate_limited} rate limited)"
    )
    return f"[red]{line}[/red]" if refused else line
