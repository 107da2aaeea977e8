"""Chunk throughput and latency of the KV-store daemon, side by side
in one run with the machine's yardsticks, on the same bytes at the same concurrency.

Paths (each client keeps one request in flight; concurrency N = N clients):
  memcpy              numpy copy of each chunk into a preallocated buffer (the hardware limit)
  daemon shm          AsyncKVStoreClient(use_shm=True): Put = put_chunks, Get = get_chunks_into
                      a preallocated buffer; checksums off (+verify rows: on; "4 keys/req":
                      one Get names 4 chunks, as a worker loading a 1024-token prefix would).
                      The warm-up round leases every chunk once, so timed Gets are the
                      client's lease-free, version-checked copies (no round trip)
  daemon shm leased   the same with the client's location cache off: one GetShm round trip
                      per Get (a chunk this client has not read before)
  daemon gRPC         the same calls with use_shm=False (bytes over the loopback gRPC stream)
  bare grpcio stream  the same bytes streamed by a bare grpc.aio server process in the
                      daemon's message size, no store (grpc_ceiling.py): grpcio's ceiling
  redis               SET/GET of the same bytes on a private loopback redis-server (no
                      persistence), with redis-py + hiredis, blocking and asyncio clients
  SSD tier / raw      cold whole-chunk reads: SsdTier.read vs O_DIRECT reads (disk_reads.py)

The daemon runs with persist_on_commit=false, so a Put is the DRAM commit (like Redis
SET without persistence) and background SSD writes do not share the 2 cores with the
measurement. Results: a table on stdout, bench/results/daemon.json and daemon.png, and
a JSON summary of 5.9 MB-chunk ratios as the last line. The issue's targets are
printed as PASS/FAIL; the exit code stays 0 (benchmarks report, they do not gate).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
from tqdm import tqdm

from attnstore.server.redis_process import RedisProcess
from attnstore.shm_arena import arena_root
from bench.common.harness import Budget
from bench.common.machine import machine_info
from bench.common.results import RESULTS_DIR, print_report, save_results, work_dir
from bench.daemon.disk_reads import RawReader, measure_cold_reads
from bench.daemon.grpc_ceiling import CeilingServer
from bench.daemon.memory_paths import BUDGETS, QUICK_BUDGET, MemoryBench, cells_per_pool
from bench.daemon.plot import plot
from bench.daemon.report import RAW, SSD_TIER, Row, add_ratios, format_table, summarize
from bench.daemon.workloads import HEADLINE, SEED, SIZE_TOKENS, ChunkPool, make_pool
from kvstore_daemon.launcher import DaemonProcess
from kvstore_daemon.ssd_tier import SsdTier

WORK_DIR = work_dir("daemon")
MiB = 1024 * 1024
DAEMON_SETTINGS = {
    "dram_capacity_bytes": 1024 * MiB,
    "ssd_capacity_bytes": 1024 * MiB,
    "max_chunk_bytes": 16 * MiB,
    "persist_on_commit": False,
    "log_level": "WARNING",
}
SSD_BUDGET = Budget(min_ops=200, min_seconds=4.0, max_bytes=4_000_000_000, max_seconds=8.0)  # both sides


async def run_all(
    pools: list[ChunkPool], address: str, redis_port: int, ceiling_address: str, args: argparse.Namespace
) -> tuple[list[Row], str]:
    ssd_cells = 2 * len(pools)
    memory_cells = sum(cells_per_pool(c) for c in args.concurrency) * len(pools)
    max_bytes = max(pool.chunk_bytes for pool in pools)
    rows: list[Row] = []
    with tqdm(total=memory_cells + ssd_cells, desc="bench-daemon", unit="cell", file=sys.stderr) as progress:
        for c in args.concurrency:
            bench = MemoryBench(address, redis_port, ceiling_address, max_bytes, progress, args.quick)
            await bench.open(c)
            try:
                for pool in pools:
                    await bench.run(pool, c)
            finally:
                await bench.close()
            rows += bench.rows
        tier = SsdTier([WORK_DIR / "ssd-tier"], capacity_bytes=1024 * MiB)
        raw = RawReader(max_bytes)
        await tier.open()
        try:
            for pool in pools:
                progress.set_postfix_str(f"SSD cold reads {pool.label}")
                budget = QUICK_BUDGET if args.quick else SSD_BUDGET
                for path, result in zip(
                    (SSD_TIER, RAW), await measure_cold_reads(tier, raw, pool, budget), strict=True
                ):
                    rows.append(
                        {
                            "path": path,
                            "op": "read",
                            "size": pool.label,
                            "chunk_bytes": pool.chunk_bytes,
                            "chunk_tokens": pool.chunk_tokens,
                            "concurrency": 1,
                            **result.as_dict(),
                        }
                    )
                    progress.update()
        finally:
            await tier.close()
            raw.close()
    return rows, raw.method


@contextlib.contextmanager
def patched_environ(extra: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4], choices=sorted(BUDGETS))
    parser.add_argument(
        "--quick", action="store_true", help="tiny budgets: a smoke run, numbers not meaningful"
    )
    parser.add_argument(
        "--daemon-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the daemon process only (e.g. GLIBC_TUNABLES=...)",
    )
    args = parser.parse_args(argv)
    started, load_before = time.monotonic(), os.getloadavg()  # other load on the machine skews the numbers
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    WORK_DIR.mkdir(parents=True)
    shm_root = arena_root(Path(tempfile.gettempdir()))
    shm_dir = Path(tempfile.mkdtemp(prefix="attnstore-bench-", dir=shm_root))
    daemon = DaemonProcess(
        WORK_DIR / "daemon" / "ssd", shm_dir, WORK_DIR / "daemon" / "daemon.log", DAEMON_SETTINGS
    )
    daemon_env = dict(item.split("=", 1) for item in args.daemon_env)
    redis_server = RedisProcess(WORK_DIR / "redis")
    ceiling = CeilingServer()
    try:
        rng = np.random.default_rng(SEED)
        pools = [
            make_pool(label, rng) for label in tqdm(SIZE_TOKENS, desc="encoding chunks", file=sys.stderr)
        ]
        with patched_environ(daemon_env):  # the daemon inherits it; this process is already running
            daemon.start()
        redis_server.start()
        ceiling.start()
        rows, raw_method = uvloop.run(
            run_all(pools, daemon.address, redis_server.port, ceiling.address, args)
        )
        machine = machine_info(WORK_DIR / "ssd-tier", redis_server.version)
        machine["daemon_ssd_disk"] = machine_info(daemon.ssd_dir, "")["ssd_disk"]
        machine["loadavg_1_5_15min"] = {"before": load_before, "after": os.getloadavg()}
    finally:
        daemon_exit = daemon.stop()
        redis_server.stop()
        ceiling.stop()
        shutil.rmtree(shm_dir, ignore_errors=True)
        shutil.rmtree(WORK_DIR, ignore_errors=True)
    if daemon_exit:
        print(f"warning: the daemon exited with code {daemon_exit}", file=sys.stderr)
    write_results(rows, pools, machine, raw_method, args, time.monotonic() - started)


def write_results(
    rows: list[Row],
    pools: list[ChunkPool],
    machine: dict[str, Any],
    raw_method: str,
    args: argparse.Namespace,
    seconds: float,
) -> None:
    add_ratios(rows)
    summaries = {c: summarize(rows, HEADLINE, c) for c in args.concurrency}
    summary, verdict_lines = summaries[min(args.concurrency)]
    for c, (extra, _) in summaries.items():
        if c != min(args.concurrency):
            summary.update(
                {f"{name}_c{c}": value for name, value in extra.items() if isinstance(value, float)}
            )
    config = {
        "model_layout": "SmolLM2-135M KV in bf16: 30 layers, 3 kv heads, head_dim 64",
        "sizes": {
            p.label: {"chunk_tokens": p.chunk_tokens, "chunk_bytes": p.chunk_bytes, "pool_chunks": p.count}
            for p in pools
        },
        "seed": SEED,
        "concurrency": args.concurrency,
        "quick": args.quick,
        "budgets": {c: vars(b) for c, b in BUDGETS.items()},
        "ssd_budget": vars(SSD_BUDGET),
        "daemon_settings": DAEMON_SETTINGS,
        "daemon_env": dict(item.split("=", 1) for item in args.daemon_env),
        "event_loop": "uvloop",
        "raw_read_method": raw_method,
        "ssd_method": "page cache evicted before every read on both sides (fsync + posix_fadvise "
        "DONTNEED); tier and raw reads alternate; tier = SsdTier.read incl. checksums",
        "throughput": "bytes of the timed rounds / their wall time; warm-up round excluded",
    }
    document = {
        "summary": summary,
        "machine": machine,
        "config": config,
        "results": rows,
        "run_seconds": round(seconds, 1),
    }
    save_results("daemon", document)
    title = (
        f"attnstore daemon vs memcpy, Redis and raw disk reads ({machine['cpu_model']}, "
        f"{machine['cpu_cores_usable']} cores, {machine['ssd_disk']['device']}); SmolLM2-135M bf16 chunks"
    )
    plot(rows, list(SIZE_TOKENS), title, RESULTS_DIR / "daemon.png")
    print(
        f"machine: {machine['cpu_model']}, {machine['cpu_cores_usable']} cores, "
        f"{machine['ram_bytes'] / 2**30:.0f} GiB RAM, SSD dir on {machine['ssd_disk']['device']} "
        f"({machine['ssd_disk']['filesystem']}); python {machine['python']}, grpcio {machine['grpcio']}, "
        f"redis-server {machine['redis_server']}"
    )
    print(f"raw disk reads: {raw_method}; run took {seconds:.0f} s\n")
    print_report(format_table(rows), verdict_lines, summary)
