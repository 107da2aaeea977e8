"""Data-plane Get and Put of the KV-store daemon next to gRPC Get, Redis GET/SET and a plain loopback socket (the limit), at 1, 4 and 16 readers.

Chunks are SmolLM2-135M KV in bf16 (30 layers, 3 KV heads, head_dim 64: 23,040 bytes a
token): 256 tokens make the 5.9 MB chunk, and 22, 87 and 347 tokens the 0.5, 2 and 8 MB
ones. Every path moves the same bytes between two processes on loopback:

  dataplane_get           the SDK without shared memory: one unheld read by keys over the
                          data plane (answered in C once a chunk was read; no lease) into a
                          preallocated buffer (checksums not verified)
  dataplane_get_blocking  the SDK's blocking client (KVStoreClient) read by threads, as redis-py's
                          rows are (no hop between an event loop and the client's threads)
  dataplane_get_verified  the same as dataplane_get, every layer's xxh3 verified (what a worker does)
  dataplane_put           ReservePut, bytes over the data plane, CommitPut (the daemon
                          verifies every layer); an untimed Delete between puts
  grpc_get                the SDK's Get stream (the fallback), into the same buffers
  redis_get, redis_set    redis-py on a private redis-server, one connection per worker
  socket_limit            an 8-byte request answered by the bytes from one buffer, recv_into
  dataplane_get_tls       dataplane_get on a daemon with TLS on (5.9 MB only)
  lmcache_get, lmcache_put  LMCache's standalone server via its lm:// connector (peer_rows.py),
                          each size's cells right after the data plane's of that size
  mooncake_te_read        Mooncake's Transfer Engine over TCP, one chunk per transfer_sync_read
  mooncake_store_get      Mooncake Store (master, a store, a client) over TCP, get_into a buffer

LMCache and Mooncake run from their own cached venvs (bench/peers/install.py); one that
cannot be installed or started is listed with the reason under the summary's `unavailable`.

Then the three-node pooled replays: hit rates of ShareGPT sessions on three daemons as
islands, as one pool (one ledger), and on one daemon with the three's capacity (pooled.py),
and the busy node's later-turn TTFT with its turns served by a real worker over the same
three layouts (pooled_ttft.py). `--pooled-only` runs the replays alone.

One summary JSON line comes last; `--results` writes the whole run as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import redis

from attnstore.chunks.format import encode_chunk
from attnstore.chunks.keys import chunk_key
from attnstore.kvstore_client import AsyncKVStoreClient, KVStoreClient
from attnstore.security import ClientCredentials
from attnstore.server.ports import free_port
from attnstore.server.redis_process import RedisProcess
from bench.common.results import print_report
from bench.pool.daemons import daemon
from bench.pool.peer_rows import LMCacheCells, mooncake_rows
from bench.pool.pooled import pooled_summary, run_pooled
from bench.pool.pooled_ttft import QUICK_TTFT_CONVERSATIONS, TTFT_CONVERSATIONS, run_pooled_ttft
from bench.pool.report import format_table, plot, verdicts
from bench.pool.socket_limit import SocketLimitClient, SocketLimitServer
from bench.pool.timing import Cell, run_tasks, run_threads
from kvstore_daemon.launcher import DaemonProcess

LAYOUT = {"num_layers": 30, "kv_heads": 3, "head_dim": 64, "dtype": "bfloat16"}
SIZES = {"0.5MB": 22, "2MB": 87, "5.9MB": 256, "8MB": 347}  # tokens per chunk
HEADLINE = "5.9MB"
MiB = 1024 * 1024
RESULTS = Path(__file__).resolve().parents[1] / "results" / "pool.json"


def _chunks(namespace: bytes, tokens: int, count: int, seed: int) -> list[tuple[bytes, bytes]]:
    rng = np.random.default_rng(seed)
    half = LAYOUT["kv_heads"] * tokens * LAYOUT["head_dim"] * 2
    made = []
    for index in range(count):
        key = chunk_key(namespace, None, range(index * tokens, (index + 1) * tokens))
        layers = [(rng.bytes(half), rng.bytes(half)) for _ in range(LAYOUT["num_layers"])]
        made.append((key, encode_chunk(
            namespace=namespace, key=key, dtype=LAYOUT["dtype"], kv_heads=LAYOUT["kv_heads"], tokens=tokens,
            head_dim=LAYOUT["head_dim"], base_position=0, layers=layers,
        )))  # fmt: skip
    return made


def _daemon(
    root: Path, name: str, tls: dict[str, str] | None = None
) -> AbstractContextManager[DaemonProcess]:
    settings: dict[str, object] = {
        "dram_capacity_bytes": 768 * MiB, "max_chunk_bytes": 16 * MiB, "ssd_capacity_bytes": 1024 * MiB,
        "persist_on_commit": False, "data_plane_port": free_port(),
    }  # fmt: skip
    return daemon(root, name, settings if tls is None else {**settings, "tls": tls})


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class Run:
    def __init__(self, concurrencies: list[int], seconds: float) -> None:
        self.concurrencies = concurrencies
        self.seconds = seconds
        self.rows: list[dict[str, Any]] = []

    def record(self, path: str, size: str, concurrency: int, cell: Cell) -> None:
        row = {"path": path, "size": size, "concurrency": concurrency, "gbps": round(cell.gbps, 3),
               "p50_ms": round(cell.p50_ms, 3), "p99_ms": round(cell.p99_ms, 3), "ops": cell.ops}  # fmt: skip
        self.rows.append(row)
        print(f"{path:<24}{size:>7}{concurrency:>4}{row['gbps']:>9.2f} GB/s  p50 {row['p50_ms']:>8.2f} ms  "
              f"p99 {row['p99_ms']:>8.2f} ms  ({cell.ops} ops)", flush=True)  # fmt: skip

    async def daemon_paths(
        self, client_for: Callable[[str], AsyncKVStoreClient], namespace: bytes, size: str,
        chunks: list[tuple[bytes, bytes]], paths: list[str],
    ) -> None:  # fmt: skip
        item_bytes = len(chunks[0][1])
        buffers = [memoryview(bytearray(item_bytes)) for _ in range(max(self.concurrencies))]
        keys = [key for key, _ in chunks]
        for path in paths:
            if path == "dataplane_get_blocking":
                self.blocking_reads(client_for(path).address, namespace, size, keys, buffers, item_bytes)
                continue
            client = client_for(path)
            for c in self.concurrencies:
                if path.endswith("put"):

                    async def op(w: int, n: int, client: AsyncKVStoreClient = client) -> None:
                        await client.put_chunks(namespace, [chunks[w]])

                    async def prepare(w: int, n: int, client: AsyncKVStoreClient = client) -> None:
                        await client.delete(namespace, [keys[w]])

                    cell = await run_tasks(op, c, self.seconds, item_bytes, prepare)
                else:

                    async def op(w: int, n: int, client: AsyncKVStoreClient = client) -> None:
                        await client.get_chunks_into(namespace, [keys[(w + n) % len(keys)]], [buffers[w]])

                    cell = await run_tasks(op, c, self.seconds, item_bytes)
                self.record(path, size, c, cell)
            assert client.client_stats().transport == ("grpc" if path == "grpc_get" else "dataplane"), path

    def blocking_reads(
        self, address: str, namespace: bytes, size: str, keys: list[bytes], buffers: list[memoryview], item_bytes: int
    ) -> None:  # fmt: skip
        """The SDK's blocking client read by threads, as redis-py's rows are."""
        with KVStoreClient(address, use_shm=False, verify_checksums=False) as client:
            for c in self.concurrencies:
                self.record("dataplane_get_blocking", size, c, run_threads(
                    lambda w, n: client.get_chunks_into(namespace, [keys[(w + n) % len(keys)]], [buffers[w]]),
                    c, self.seconds, item_bytes))  # fmt: skip
            assert client.client_stats().transport == "dataplane"

    def redis_paths(self, url: str, size: str, chunks: list[tuple[bytes, bytes]]) -> None:
        item_bytes = len(chunks[0][1])
        conns = [redis.Redis.from_url(url) for _ in range(max(self.concurrencies))]
        for key, data in chunks:
            conns[0].set(key, data)
        for c in self.concurrencies:
            self.record(
                "redis_get",
                size,
                c,
                run_threads(
                    lambda w, n: conns[w].get(chunks[(w + n) % len(chunks)][0]), c, self.seconds, item_bytes
                ),
            )
            self.record("redis_set", size, c, run_threads(
                lambda w, n: conns[w].set(b"set/%d" % w, chunks[w][1]), c, self.seconds, item_bytes))  # fmt: skip
        conns[0].flushall()
        for conn in conns:
            conn.close()

    def socket_limit(self, port: int, size: str, item_bytes: int) -> None:
        clients = [SocketLimitClient(port) for _ in range(max(self.concurrencies))]
        buffers = [memoryview(bytearray(item_bytes)) for _ in clients]
        for c in self.concurrencies:
            self.record("socket_limit", size, c, run_threads(
                lambda w, n: clients[w].get_into(buffers[w]), c, self.seconds, item_bytes))  # fmt: skip
        for client in clients:
            client.close()


def _ratio(rows: list[dict[str, Any]], path: str, versus: str, size: str) -> dict[str, float]:
    by = {(r["path"], r["size"], r["concurrency"]): r["gbps"] for r in rows}
    ratios = {
        str(c): round(by[(path, size, c)] / by[(versus, size, c)], 3)
        for (p, s, c) in by
        if p == path and s == size and by.get((versus, size, c))
    }
    return ratios | ({"min": min(ratios.values())} if ratios else {})


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "dataplane_get_vs_redis_get": _ratio(rows, "dataplane_get", "redis_get", HEADLINE),
        "dataplane_get_vs_socket_limit": _ratio(rows, "dataplane_get", "socket_limit", HEADLINE),
        "dataplane_get_vs_lmcache": _ratio(rows, "dataplane_get", "lmcache_get", HEADLINE),
        "dataplane_put_vs_lmcache_put": _ratio(rows, "dataplane_put", "lmcache_put", HEADLINE),
        "dataplane_get_vs_mooncake_te": _ratio(rows, "dataplane_get", "mooncake_te_read", HEADLINE),
        "dataplane_get_vs_mooncake_store": _ratio(rows, "dataplane_get", "mooncake_store_get", HEADLINE),
        "dataplane_get_vs_grpc_get": _ratio(rows, "dataplane_get", "grpc_get", HEADLINE),
        "dataplane_put_vs_redis_set": _ratio(rows, "dataplane_put", "redis_set", HEADLINE),
        "dataplane_get_verified_vs_unverified": _ratio(
            rows, "dataplane_get_verified", "dataplane_get", HEADLINE
        ),
        "dataplane_get_tls_vs_plaintext": _ratio(rows, "dataplane_get_tls", "dataplane_get", HEADLINE),
        "dataplane_get_vs_redis_get_every_size": {
            size: _ratio(rows, "dataplane_get", "redis_get", size).get("min") for size in SIZES
        },
        "dataplane_get_blocking_vs_redis_get_every_size": {
            size: _ratio(rows, "dataplane_get_blocking", "redis_get", size).get("min") for size in SIZES
        },
        "dataplane_get_blocking_vs_lmcache": _ratio(rows, "dataplane_get_blocking", "lmcache_get", HEADLINE),
    }
    return summary


def _namespace(size: str) -> bytes:
    return f"pool-bench-{size}".encode().ljust(16, b".")[:16]


async def _measure_daemon(
    run: Run, daemon: DaemonProcess, size: str, chunks: list[tuple[bytes, bytes]], paths: list[str],
    **client_options: Any,
) -> None:  # fmt: skip
    namespace = _namespace(size)
    clients: dict[str, AsyncKVStoreClient] = {}

    def client_for(path: str) -> AsyncKVStoreClient:
        if path not in clients:
            clients[path] = AsyncKVStoreClient(
                daemon.address, use_shm=False, use_data_plane=path != "grpc_get",
                verify_checksums=path == "dataplane_get_verified", **client_options,
            )  # fmt: skip
        return clients[path]

    setup = client_for(paths[0])
    await setup.register_namespace(namespace, chunk_tokens=SIZES[size], **LAYOUT)
    await setup.put_chunks(namespace, chunks)
    try:
        await run.daemon_paths(client_for, namespace, size, chunks, paths)
    finally:
        await setup.delete(namespace, [key for key, _ in chunks])
        for client in clients.values():
            await client.close()


def _peer_rows(
    run: Run, args: argparse.Namespace, root: Path, lmcache: LMCacheCells | None
) -> tuple[dict[str, str], dict[str, str]]:
    """Mooncake's rows: (why each peer that could not run did not, LMCache's included; their versions)."""
    unavailable: dict[str, str] = {}
    peers: dict[str, str] = {}
    if lmcache is not None and lmcache.failure is not None:
        unavailable["lmcache"] = lmcache.failure
    if not args.no_mooncake:
        sizes = {size: SIZES[size] for size in args.sizes}
        for name, store in (("mooncake_transfer_engine", False), ("mooncake_store", True)):
            reason, peers[name] = mooncake_rows(
                run.record, sizes, LAYOUT, run.concurrencies, run.seconds, root, store=store
            )
            if reason:
                unavailable[name] = reason
    for name, reason in unavailable.items():
        print(f"{name}: UNAVAILABLE: {reason}", flush=True)
    return unavailable, peers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="0.5 s a cell instead of 2 s (a smoke run)")
    parser.add_argument("--seconds", type=float, default=None, help="timed seconds per cell")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--no-tls", action="store_true", help="skip the TLS rows")
    parser.add_argument("--no-pooled", action="store_true", help="skip the pooled replays")
    parser.add_argument("--pooled-only", action="store_true", help="only the pooled replays")
    parser.add_argument("--no-lmcache", action="store_true", help="skip LMCache's rows")
    parser.add_argument(
        "--no-mooncake", action="store_true", help="skip Mooncake's Transfer Engine and Store rows"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the run's JSON goes")
    args = parser.parse_args(argv)
    if args.pooled_only:
        args.sizes, args.no_tls, args.no_lmcache, args.no_mooncake = [], True, True, True
    run = Run(sorted(args.concurrency), args.seconds or (0.5 if args.quick else 2.0))
    count = max(16, max(run.concurrencies))  # a chunk per put worker; readers spread over them
    daemon_paths = [
        "dataplane_get",
        "dataplane_get_blocking",
        "dataplane_get_verified",
        "grpc_get",
        "dataplane_put",
    ]
    with tempfile.TemporaryDirectory(prefix="attnstore-bench-pool-") as tmp:
        root = Path(tmp)
        redis_server = RedisProcess(root / "redis")
        redis_server.start()
        limit = SocketLimitServer(16 * MiB)
        lmcache: LMCacheCells | None = None
        try:
            if not args.no_lmcache and args.sizes:
                lmcache = LMCacheCells(args.sizes, run.concurrencies, run.seconds, root)
            with _daemon(root, "daemon") as daemon:
                for size in args.sizes:
                    chunks = _chunks(_namespace(size), SIZES[size], count, seed=SIZES[size])
                    asyncio.run(_measure_daemon(run, daemon, size, chunks, daemon_paths))
                    run.redis_paths(redis_server.url, size, chunks)
                    run.socket_limit(limit.port, size, len(chunks[0][1]))
                    if lmcache is not None:
                        lmcache.record(run.record, size)
            if not args.no_tls and HEADLINE in args.sizes:
                cert, key = _self_signed(root)
                context = ssl.create_default_context(cafile=str(cert))
                credentials = ClientCredentials.from_pem(cert.read_bytes())
                with _daemon(root, "tls-daemon", {"cert_file": str(cert), "key_file": str(key)}) as daemon:
                    tls_run = Run(run.concurrencies, run.seconds)
                    chunks = _chunks(_namespace(HEADLINE), SIZES[HEADLINE], count, seed=1)
                    asyncio.run(_measure_daemon(
                        tls_run, daemon, HEADLINE, chunks, ["dataplane_get"],
                        credentials=credentials, data_plane_tls=context,
                    ))  # fmt: skip
                    run.rows += [r | {"path": "dataplane_get_tls"} for r in tls_run.rows]
            if lmcache is not None:
                lmcache.close()
            unavailable, peers = _peer_rows(run, args, root, lmcache)
            pooled: dict[str, Any] = {}
            if not args.no_pooled:
                ttft_conversations = QUICK_TTFT_CONVERSATIONS if args.quick else TTFT_CONVERSATIONS
                pooled = run_pooled(root) | {"worker_replay": run_pooled_ttft(root, ttft_conversations)}
        finally:
            if lmcache is not None:
                lmcache.close()
            limit.close()
            redis_server.stop()
    summary = summarize(run.rows) | {"unavailable": unavailable} | (pooled_summary(pooled) if pooled else {})
    machine = {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "python": sys.version.split()[0]}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(
        {"machine": machine, "seconds_per_cell": run.seconds, "rows": run.rows, "pooled_replay": pooled,
         "peer_versions": peers, "summary": summary}, indent=1) + "\n")  # fmt: skip
    if run.rows:
        plot(
            run.rows,
            f"attnstore data plane vs gRPC, Redis and the loopback socket ({machine['cpus']} CPUs)",
            args.results.with_suffix(".png"),
        )
    print_report(format_table(run.rows), verdicts(summary), summary)


if __name__ == "__main__":
    main()
