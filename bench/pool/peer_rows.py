"""bench-pool's rows of other systems' byte paths, each run from its own cached venv
(bench/peers/install.py), beside the data plane's on the same loopback:

  lmcache_get, lmcache_put  LMCache's standalone server (`lmcache_server`) through its lm://
                            connector, the client LMCache's engine uses (bench-peers' driver:
                            bench/peers/lmcache_driver.py via bench/peers/store.py's LMCacheSide)
  mooncake_te_read          Mooncake's Transfer Engine over TCP: transfer_sync_read of one
                            whole chunk from another engine's registered buffer
                            (mooncake_driver.py, a serving and a reading process)
  mooncake_store_get        Mooncake Store: its master (`mooncake_master`, HTTP metadata
                            server on), a store process that mounts memory and puts the
                            chunks, and a reading client's `get_into` a registered buffer
                            (mooncake_store_driver.py)

A system that cannot be installed or started gives no rows and a reason (the summary's
`unavailable`), and the run goes on. Mooncake's extension needs Debian's `libibverbs1`
even for TCP: `make bench-pool` installs it (scripts/ensure_ibverbs.sh, root or sudo).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from attnstore.chunks.format import max_chunk_bytes
from attnstore.server.ports import free_port
from bench.common.harness import Budget
from bench.common.results import BENCH_DIR
from bench.daemon.workloads import ChunkPool, make_pool
from bench.peers.install import PeerVenv, ensure_peer
from bench.peers.store import LMCacheSide, readline_within, stop_process
from bench.pool.timing import Cell

Record = Callable[[str, str, int, Cell], None]  # Run.record: (path, size, concurrency, cell)
_START_SECONDS = 120.0
_CHUNKS_SERVED = 16


class LMCacheCells:
    """LMCache's server and driver, started once; each size's Get and Put cells are
    recorded when asked, right after the data plane's cells of that size, so both sides
    run in the same minutes (measured after every other row, LMCache's 5.9 MB cells once
    moved 2.3 -> 3.5 GB/s from one to sixteen readers while the socket limit beside ours
    moved 2.3-3.2: two machine loads compared). `failure` says why it recorded nothing."""

    def __init__(
        self, sizes: Sequence[str], concurrencies: Sequence[int], seconds: float, work_dir: Path
    ) -> None:
        self._concurrencies = concurrencies
        self._budget = Budget(min_ops=4, min_seconds=seconds, max_bytes=10**12, max_seconds=2 * seconds)
        self._side: LMCacheSide | None = None
        self._pools: dict[str, ChunkPool] = {}
        self.failure: str | None = None
        peer = ensure_peer("lmcache")
        if not peer.available:
            self.failure = f"LMCache not installed: {peer.reason[-500:]}"
            return
        self._pools = {
            size: make_pool(size, np.random.default_rng(index)) for index, size in enumerate(sizes)
        }
        self._side = LMCacheSide(peer, list(self._pools.values()), work_dir, max(concurrencies))
        try:
            self._side.start()
        except BaseException as exc:
            self.close()  # whatever of it started
            if not isinstance(exc, RuntimeError):
                raise
            self.failure = f"LMCache's server did not start: {exc}"

    def record(self, record: Record, size: str) -> None:
        """Records the cells of `size` (nothing once LMCache has failed)."""
        if self.failure is not None or self._side is None:
            return
        for c in self._concurrencies:  # the driver makes new clients at each new concurrency
            for op in ("put", "get"):
                row = self._side.cell(self._pools[size], c, op, self._budget)
                if row is None:
                    self.failure = f"LMCache's driver failed: {self._side.failure}"
                    return
                cell = Cell(row["ops"], row["seconds"], row["chunk_bytes"], row["p50_ms"], row["p99_ms"])
                record(f"lmcache_{op}", size, c, cell)

    def close(self) -> None:
        side, self._side = self._side, None
        if side is not None:
            side.stop()


class _Driver:
    """A driver module of one peer in one mode: JSON lines in and out."""

    def __init__(self, peer: PeerVenv, module: str, mode: str, spec: dict[str, Any], log: Path) -> None:
        assert peer.python is not None
        with log.open("a") as err:
            self.process = subprocess.Popen(
                [str(peer.python), "-m", module, mode], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True, env=peer.env(), cwd=BENCH_DIR.parent,
            )  # fmt: skip
        self.module = module
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
            raise RuntimeError(f"{self.module} stopped (exit code {self.process.poll()}): {tail}")
        return json.loads(line)

    def stop(self) -> None:
        stop_process(self.process)


def _served_cells(
    record: Record, peer: PeerVenv, module: str, path: str, item_sizes: dict[str, int],
    concurrencies: Sequence[int], seconds: float, log: Path, spec: dict[str, Any],
) -> str:  # fmt: skip
    """Per size, a serving and a reading driver of `module` (spec plus the size's); records
    the reader's cells under `path`; the version the server names."""
    version = ""
    for size, item_bytes in item_sizes.items():
        drivers: list[_Driver] = []
        try:
            sized = {**spec, "item_bytes": item_bytes, "count": _CHUNKS_SERVED}
            drivers.append(_Driver(peer, module, "serve", sized, log))
            served = drivers[0].receive(_START_SECONDS)
            version = served["version"]
            reader = _Driver(
                peer, module, "read", {**sized, **served, "max_concurrency": max(concurrencies)}, log
            )
            drivers.append(reader)
            reader.receive(_START_SECONDS)
            for c in concurrencies:
                reader.send({"concurrency": c, "seconds": seconds})
                row = reader.receive(seconds * 4 + _START_SECONDS)
                record(
                    path, size, c, Cell(row["ops"], row["seconds"], item_bytes, row["p50_ms"], row["p99_ms"])
                )
        finally:
            for driver in reversed(drivers):
                driver.stop()
    return version


def _item_sizes(sizes: dict[str, int], layout: dict[str, Any]) -> dict[str, int]:
    """Bytes of a chunk of each size's tokens: the data plane's chunks."""
    return {size: max_chunk_bytes(chunk_tokens=tokens, **layout) for size, tokens in sizes.items()}


def mooncake_rows(
    record: Record, sizes: dict[str, int], layout: dict[str, Any], concurrencies: Sequence[int], seconds: float,
    work_dir: Path, *, store: bool = False,
) -> tuple[str | None, str]:  # fmt: skip
    """Records Mooncake's cells on chunks as large as the data plane's: its Transfer
    Engine's reads, or with `store` its Store's Gets (a master, a store and a client on
    loopback); (the reason it could not, else None; the package's version)."""
    what = "Mooncake Store" if store else "Mooncake's Transfer Engine"
    peer = ensure_peer("mooncake")
    if not peer.available:
        return f"{what} unavailable (needs Debian's libibverbs1): {peer.reason[-500:]}", ""
    module, path = (
        ("mooncake_store_driver", "mooncake_store_get") if store else ("mooncake_driver", "mooncake_te_read")
    )
    log = work_dir / f"{module}.log"
    version = ""
    failed = []  # a size that fails (a read outliving its lease under load) leaves the others measured
    for size, item_bytes in _item_sizes(sizes, layout).items():
        try:
            # A master per size: a stopped store's segment stays in a master for its client
            # TTL, and objects allocated there fail to transfer (TRANSFER_FAIL).
            with (
                _master(peer, work_dir / "mooncake_master.log")
                if store
                else contextlib.nullcontext({}) as spec
            ):
                version = (
                    _served_cells(
                        record,
                        peer,
                        f"bench.pool.{module}",
                        path,
                        {size: item_bytes},
                        concurrencies,
                        seconds,
                        log,
                        spec,
                    )
                    or version
                )
        except (RuntimeError, OSError, ValueError, KeyError) as exc:
            failed.append(f"{size}: {exc}")
    return (f"{what} failed at {'; '.join(failed)}" if failed else None), version


@contextlib.contextmanager
def _master(peer: PeerVenv, log: Path) -> Iterator[dict[str, Any]]:
    """A `mooncake_master` with its HTTP metadata server, on loopback; the drivers' spec."""
    assert peer.python is not None
    rpc, metadata, metrics = free_port(), free_port(), free_port()
    with log.open("a") as out:
        master = subprocess.Popen(
            [str(peer.python.parent / "mooncake_master"), f"--rpc_port={rpc}", f"--metrics_port={metrics}",
             "--enable_http_metadata_server=true", f"--http_metadata_server_port={metadata}",
             "--http_metadata_server_host=127.0.0.1", "--rpc_address=127.0.0.1",
             # A read holds the object's lease (10 s by default): 16 readers of 8 MB at a
             # load of 20 on 2 cores outlived it (LEASE_EXPIRED), which times nothing.
             "--default_kv_lease_ttl=60s"],
            stdout=out, stderr=subprocess.STDOUT, env=peer.env(),
        )  # fmt: skip
    try:
        _wait_for_port(metadata, master, log)
        _wait_for_port(rpc, master, log)
        yield {"master": f"127.0.0.1:{rpc}", "metadata": f"127.0.0.1:{metadata}"}
    finally:
        stop_process(master)


def _wait_for_port(port: int, process: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mooncake_master exited with {process.returncode}: {log.read_text()[-1500:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"mooncake_master did not listen on {port} within {_START_SECONDS} s")
