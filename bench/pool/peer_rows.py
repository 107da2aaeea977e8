"""bench-pool's rows of other systems' byte paths, each run from its own cached venv
(bench/peers/install.py), beside the data plane's on the same loopback:

  lmcache_get, lmcache_put  LMCache's standalone server (`lmcache_server`) through its lm://
                            connector, the client LMCache's engine uses (bench-peers' driver:
                            bench/peers/lmcache_driver.py via bench/peers/store.py's LMCacheSide)
  mooncake_te_read          Mooncake's Transfer Engine over TCP: transfer_sync_read of one
                            whole chunk from another engine's registered buffer
                            (mooncake_driver.py, a serving and a reading process)

A system that cannot be installed or started gives no rows and a reason (the summary's
`unavailable`), and the run goes on: Mooncake's extension needs Debian's `libibverbs1`
even for TCP, which the benchmark does not install itself (it needs root).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from attnstore.chunks.format import max_chunk_bytes
from bench.common.harness import Budget
from bench.common.results import BENCH_DIR
from bench.daemon.workloads import make_pool
from bench.peers.install import PeerVenv, ensure_peer
from bench.peers.store import LMCacheSide, readline_within
from bench.pool.timing import Cell

Record = Callable[[str, str, int, Cell], None]  # Run.record: (path, size, concurrency, cell)
_START_SECONDS = 120.0
_CHUNKS_SERVED = 16


def lmcache_rows(
    record: Record, sizes: Sequence[str], concurrencies: Sequence[int], seconds: float, work_dir: Path
) -> str | None:
    """Records LMCache's Get and Put cells; the reason it could not, else None."""
    peer = ensure_peer("lmcache")
    if not peer.available:
        return f"LMCache not installed: {peer.reason[-500:]}"
    pools = [make_pool(size, np.random.default_rng(index)) for index, size in enumerate(sizes)]
    side = LMCacheSide(peer, pools, work_dir, max(concurrencies))
    budget = Budget(min_ops=4, min_seconds=seconds, max_bytes=10**12, max_seconds=2 * seconds)
    try:
        side.start()
        for c in concurrencies:  # the driver makes new clients at each new concurrency
            for pool in pools:
                for op in ("put", "get"):
                    row = side.cell(pool, c, op, budget)
                    if row is None:
                        return f"LMCache's driver failed: {side.failure}"
                    cell = Cell(row["ops"], row["seconds"], row["chunk_bytes"], row["p50_ms"], row["p99_ms"])
                    record(f"lmcache_{op}", pool.label, c, cell)
    except RuntimeError as exc:
        return f"LMCache's server did not start: {exc}"
    finally:
        side.stop()
    return None


class _Driver:
    """mooncake_driver.py in one mode: JSON lines in and out."""

    def __init__(self, peer: PeerVenv, mode: str, spec: dict[str, Any], log: Path) -> None:
        assert peer.python is not None
        with log.open("a") as err:
            self.process = subprocess.Popen(
                [str(peer.python), "-m", "bench.pool.mooncake_driver", mode], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True, env=peer.env(), cwd=BENCH_DIR.parent,
            )  # fmt: skip
        self.log = log
        self.send(spec)

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def receive(self, timeout_seconds: float) -> dict[str, Any]:
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None
        line = readline_within(stdout, timeout_seconds)
        if not line:
            tail = self.log.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"mooncake_driver stopped (exit code {self.process.poll()}): {tail}")
        return json.loads(line)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def mooncake_rows(
    record: Record, sizes: dict[str, int], layout: dict[str, Any], concurrencies: Sequence[int], seconds: float,
    work_dir: Path,
) -> tuple[str | None, str]:  # fmt: skip
    """Records the Transfer Engine's read cells of chunks as large as the data plane's;
    (the reason it could not, else None; the engine's version)."""
    peer = ensure_peer("mooncake")
    if not peer.available:
        return (
            f"Mooncake's Transfer Engine unavailable (needs Debian's libibverbs1): {peer.reason[-500:]}",
            "",
        )
    drivers: list[_Driver] = []
    version = ""
    try:
        for size, tokens in sizes.items():
            item_bytes = max_chunk_bytes(chunk_tokens=tokens, **layout)
            server = _Driver(
                peer, "serve", {"item_bytes": item_bytes, "count": _CHUNKS_SERVED}, work_dir / "mooncake.log"
            )
            drivers.append(server)
            served = server.receive(_START_SECONDS)
            version = served["version"]
            reader = _Driver(peer, "read", {
                **served, "item_bytes": item_bytes, "count": _CHUNKS_SERVED, "max_concurrency": max(concurrencies),
            }, work_dir / "mooncake.log")  # fmt: skip
            drivers.append(reader)
            reader.receive(_START_SECONDS)
            for c in concurrencies:
                reader.send({"concurrency": c, "seconds": seconds})
                row = reader.receive(seconds * 4 + _START_SECONDS)
                record(
                    "mooncake_te_read",
                    size,
                    c,
                    Cell(row["ops"], row["seconds"], item_bytes, row["p50_ms"], row["p99_ms"]),
                )
            for driver in drivers:
                driver.stop()
            drivers.clear()
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        return f"Mooncake's Transfer Engine failed: {exc}", version
    finally:
        for driver in drivers:
            driver.stop()
    return None, version
