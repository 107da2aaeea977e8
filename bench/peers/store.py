"""Store vs store: our KV-store daemon and LMCache's standalone server storing and
retrieving the same chunks (SmolLM2-135M KV in bf16, bench/daemon/workloads.py), at the same client
concurrency, with the same timing harness (bench/common/harness.py), cell by cell in one run.

    daemon gRPC        AsyncKVStoreClient(use_shm=False): chunk bytes over loopback gRPC.
                       The apples-to-apples row: LMCache's server is also a byte stream
                       over a loopback socket (TCP, its own binary protocol)
    daemon shm         the same calls over the daemon's shared memory (a same-node
                       worker's path; LMCache's standalone server has no such path). Timed
                       Gets re-read chunks, so they are the client's lease-free copies
    daemon shm leased  Get with the client's location cache off: one GetShm round trip each
    LMCache server     LMCache's lm:// connector against `lmcache_server` (lmcache_driver.py,
                       a long-lived process in LMCache's venv that measures one cell per request)

Put = a confirmed write (our CommitPut; LMCache PUT + EXIST); Get = the whole chunk into
client memory. Each (concurrency, size, op) is measured on the three paths back to back,
so a burst of other load on this shared machine lands on all of them. The daemon runs
without write-through to SSD, like LMCache's server, which keeps chunks in a Python dict.
"""

from __future__ import annotations

import asyncio
import json
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import numpy as np
from tqdm import tqdm

from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore.server.ports import free_port
from attnstore.shm_arena import arena_root
from bench.common.harness import Budget, run_tasks
from bench.common.results import BENCH_DIR
from bench.daemon.memory_paths import BUDGETS, QUICK_BUDGET
from bench.daemon.report import GRPC, SHM, SHM_LEASED, Row
from bench.daemon.run import DAEMON_SETTINGS
from bench.daemon.workloads import HEAD_DIM, KV_HEADS, LAYERS, SEED, ChunkPool, make_pool
from bench.peers.install import PeerVenv
from kvstore_daemon.launcher import DaemonProcess

SIZES = ("0.5MB", "5.9MB")  # a small chunk (22 tokens) and the real 256-token one
SERVER_READY_SECONDS = 60.0
DRIVER_READY_SECONDS = 180.0


def budget_of(concurrency: int, quick: bool) -> Budget:
    return QUICK_BUDGET if quick else BUDGETS[concurrency]


def _shm_root() -> Path:
    return arena_root(Path(tempfile.gettempdir()))


class DaemonCells:
    """`concurrency` clients per path (shared memory, gRPC), one destination buffer each."""

    def __init__(self, address: str, concurrency: int, max_bytes: int) -> None:
        def clients(**options: object) -> list[AsyncKVStoreClient]:
            return [AsyncKVStoreClient(address, **options) for _ in range(concurrency)]  # type: ignore[arg-type]

        self.clients = {
            SHM: clients(),
            SHM_LEASED: clients(location_cache_entries=0),
            GRPC: clients(use_shm=False),
        }
        self.outs = [np.zeros(max_bytes, np.uint8) for _ in range(concurrency)]

    async def open(self, pools: list[ChunkPool]) -> None:
        admin = self.clients[SHM][0]
        if not await admin.open_shm():
            raise RuntimeError("the daemon's shared-memory arena cannot be mapped from this process")
        for pool in pools:
            await admin.register_namespace(pool.namespace, **pool.layout(), model_label="bench-peers")

    async def cell(self, path: str, pool: ChunkPool, op: str, budget: Budget) -> Row:
        """Put: every timed Put stores a new chunk (the pool is deleted between rounds and
        after). Get: reads the pool, which `store` put there beforehand."""
        clients, ns, keys, chunks = self.clients[path], pool.namespace, pool.keys, pool.chunks

        async def delete_all() -> None:
            await self.delete(pool)

        async def put(w: int, i: int) -> None:
            if len((await clients[w].put_chunks(ns, [(keys[i], chunks[i])])).stored) != 1:
                raise RuntimeError(f"put of chunk {i} was not stored")

        async def get(w: int, i: int) -> None:
            await clients[w].get_chunks_into(ns, [keys[i]], [self.outs[w]])

        result = await run_tasks(
            put if op == "put" else get,
            item_bytes=pool.chunk_bytes,
            count=pool.count,
            concurrency=len(clients),
            budget=budget,
            between_rounds=delete_all if op == "put" else None,
        )
        if op == "put":
            await delete_all()
        return {
            "path": path,
            "op": op,
            "size": pool.label,
            "chunk_bytes": pool.chunk_bytes,
            "chunk_tokens": pool.chunk_tokens,
            "concurrency": len(clients),
            **result.as_dict(),
        }

    async def store(self, pool: ChunkPool) -> None:
        await self.clients[SHM][0].put_chunks(pool.namespace, list(zip(pool.keys, pool.chunks, strict=True)))

    async def delete(self, pool: ChunkPool) -> None:
        await self.clients[SHM][0].delete(pool.namespace, pool.keys)

    async def close(self) -> None:
        for clients in self.clients.values():
            for client in clients:
                await client.close()


class LMCacheSide:
    """`lmcache_server 127.0.0.1 <port> cpu` and the driver, both from LMCache's venv; the
    pools' bytes go to the driver as files in a tmpfs."""

    def __init__(self, peer: PeerVenv, pools: list[ChunkPool], work_dir: Path, max_concurrency: int) -> None:
        self.peer, self.pools, self.work_dir, self.max_concurrency = peer, pools, work_dir, max_concurrency
        self.port = free_port()
        self.files = Path(tempfile.mkdtemp(prefix="attnstore-peers-", dir=_shm_root()))
        self.server: subprocess.Popen[bytes] | None = None
        self.driver: subprocess.Popen[str] | None = None
        self.versions: dict[str, str] = {}
        self.failure: str | None = None  # why it stopped answering mid-run

    def start(self) -> None:
        assert self.peer.python is not None
        with (self.work_dir / "lmcache_server.log").open("ab") as log:
            self.server = subprocess.Popen(
                [str(self.peer.python.with_name("lmcache_server")), "127.0.0.1", str(self.port), "cpu"],
                stdout=log,
                stderr=log,
                env=self.peer.env(),
            )
        self._wait_listening()
        with (self.work_dir / "lmcache_driver.log").open("a") as log:
            # `-m` from the repository root: the driver imports bench.* as every module does.
            self.driver = subprocess.Popen(
                [str(self.peer.python), "-m", "bench.peers.lmcache_driver"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=self.peer.env(),
                cwd=BENCH_DIR.parent,
            )
        self._send(
            {
                "host": "127.0.0.1",
                "port": self.port,
                "pools": self._write_pools(),
                "max_concurrency": self.max_concurrency,
            }
        )
        ready = self._receive(DRIVER_READY_SECONDS)
        self.versions = {"lmcache": ready["lmcache"], "lmcache_torch": ready["torch"]}

    def _wait_listening(self) -> None:
        assert self.server is not None
        deadline = time.monotonic() + SERVER_READY_SECONDS
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(
                    f"lmcache_server exited with {self.server.returncode}: see "
                    f"{self.work_dir / 'lmcache_server.log'}"
                )
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"lmcache_server not listening after {SERVER_READY_SECONDS:g} s")
            time.sleep(0.2)

    def _write_pools(self) -> list[dict[str, Any]]:
        specs = []
        for index, pool in enumerate(self.pools):
            path = self.files / f"pool-{pool.label}.bin"
            with path.open("wb") as out:
                for chunk in pool.chunks:
                    out.write(chunk)
            specs.append(
                {
                    "label": pool.label,
                    "file": str(path),
                    "count": pool.count,
                    "chunk_bytes": pool.chunk_bytes,
                    "chunk_tokens": pool.chunk_tokens,
                    "layers": LAYERS,
                    "kv_heads": KV_HEADS,
                    "head_dim": HEAD_DIM,
                    "key_base": index * 1_000_000,
                }
            )
        return specs

    def _send(self, message: dict[str, Any]) -> None:
        assert self.driver is not None and self.driver.stdin is not None
        self.driver.stdin.write(json.dumps(message) + "\n")
        self.driver.stdin.flush()

    def _receive(self, timeout_seconds: float) -> dict[str, Any]:
        assert self.driver is not None and self.driver.stdout is not None
        line = readline_within(self.driver.stdout, timeout_seconds)
        if not line:
            tail = (self.work_dir / "lmcache_driver.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the LMCache driver stopped (exit code {self.driver.poll()}):\n{tail}")
        return json.loads(line)

    def cell(self, pool: ChunkPool, concurrency: int, op: str, budget: Budget) -> Row | None:
        """One measured cell; None (and `failure` says why) once the driver has failed."""
        if self.failure is not None:
            return None
        try:
            self._send({"size": pool.label, "concurrency": concurrency, "op": op, "budget": vars(budget)})
            return self._receive(budget.max_seconds * 4 + 120)
        except (RuntimeError, OSError, ValueError) as exc:
            self.failure = str(exc)
            return None

    def stop(self) -> None:
        for process in (self.driver, self.server):
            if process is not None:
                stop_process(process)
        shutil.rmtree(self.files, ignore_errors=True)


def readline_within(stream: IO[str], timeout_seconds: float) -> str:
    """One line from a child's pipe, or "" once it closes or `timeout_seconds` pass."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout_seconds):
            return ""
    return stream.readline()


async def _measure(
    daemon: DaemonProcess,
    lmcache: LMCacheSide | None,
    pools: list[ChunkPool],
    concurrency: list[int],
    quick: bool,
    progress: tqdm,
) -> list[Row]:
    rows: list[Row] = []
    for c in concurrency:
        cells = DaemonCells(daemon.address, c, max(pool.chunk_bytes for pool in pools))
        try:
            await cells.open(pools)
            for pool in pools:
                for op in ("put", "get"):
                    if op == "get":
                        await cells.store(pool)
                    for path in (SHM, SHM_LEASED, GRPC) if op == "get" else (SHM, GRPC):
                        progress.set_postfix_str(f"{path} {op} {pool.label} c={c}")
                        rows.append(await cells.cell(path, pool, op, budget_of(c, quick)))
                        progress.update()
                    if lmcache is not None:
                        progress.set_postfix_str(f"LMCache {op} {pool.label} c={c}")
                        row = await asyncio.to_thread(lmcache.cell, pool, c, op, budget_of(c, quick))
                        rows += [row] if row is not None else []
                        progress.update()
                await cells.delete(pool)
        finally:
            await cells.close()
    return rows


def run_store(peer: PeerVenv, concurrency: list[int], work_dir: Path, quick: bool) -> dict[str, Any]:
    """Both stores on the same pools; {rows, versions, unavailable, sizes, daemon_settings}."""
    rng = np.random.default_rng(SEED)
    pools = [make_pool(label, rng) for label in SIZES]
    shm_dir = Path(tempfile.mkdtemp(prefix="attnstore-peers-", dir=_shm_root()))
    daemon = DaemonProcess(work_dir / "ssd", shm_dir, work_dir / "daemon.log", DAEMON_SETTINGS)
    lmcache = LMCacheSide(peer, pools, work_dir, max(concurrency)) if peer.available else None
    outcome: dict[str, Any] = {"versions": {}, "unavailable": None if peer.available else peer.reason}
    ours, theirs = 5, 2  # per (concurrency, pool): our Puts on 2 paths and Gets on 3; LMCache's Put and Get
    cells = len(concurrency) * len(pools) * (ours + (theirs if lmcache else 0))
    try:
        daemon.start()
        if lmcache is not None:
            try:
                lmcache.start()
                outcome["versions"] = lmcache.versions
            except (RuntimeError, OSError, ValueError) as exc:
                outcome["unavailable"], cells = str(exc), len(concurrency) * len(pools) * ours
                lmcache.stop()
                lmcache = None
        with tqdm(total=cells, desc="bench-peers store", unit="cell", file=sys.stderr) as progress:
            outcome["rows"] = asyncio.run(_measure(daemon, lmcache, pools, concurrency, quick, progress))
        if lmcache is not None and lmcache.failure is not None:
            outcome["unavailable"] = lmcache.failure
    finally:
        if lmcache is not None:
            lmcache.stop()
        daemon.stop()
        shutil.rmtree(shm_dir, ignore_errors=True)
    outcome["sizes"] = {
        p.label: {"chunk_tokens": p.chunk_tokens, "chunk_bytes": p.chunk_bytes, "pool_chunks": p.count}
        for p in pools
    }
    outcome["daemon_settings"] = DAEMON_SETTINGS
    return outcome


def stop_process(process: subprocess.Popen[Any]) -> None:
    """Terminates `process` if it runs, then kills it if it has not exited in 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
