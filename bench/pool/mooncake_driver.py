"""Mooncake's Transfer Engine for bench-pool: runs INSIDE the Mooncake venv
(bench/peers/install.py), started by bench/pool/peer_rows.py, one process per side.

    serve  a TransferEngine over TCP (P2P handshake, no metadata server) with `count`
           chunks of random bytes in one registered buffer; prints its session, the
           buffer's address and the first chunk's sha256, then waits for stdin to close
    read   a second engine whose workers each own a registered buffer of one chunk; per
           cell line ({"concurrency", "seconds"}) every worker keeps one
           transfer_sync_read of a whole chunk from the serving engine in flight
           (closed loop, bench/pool/timing.py) and one JSON row answers

The same chunk sizes as the data plane's rows, on the same loopback; the first read is
checked against the served bytes before any cell is timed.

    <mooncake venv>/bin/python -m bench.pool.mooncake_driver serve|read < JSON lines   # from the repository root
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib.metadata import version

import numpy as np
from mooncake.engine import TransferEngine

from bench.pool.driver_cells import answer_cells

HOST = "127.0.0.1"


def _engine() -> TransferEngine:
    engine = TransferEngine()
    if engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("TransferEngine.initialize failed")
    return engine


def _registered(engine: TransferEngine, nbytes: int) -> np.ndarray:
    buffer = np.zeros(nbytes, np.uint8)
    if engine.register_memory(buffer.ctypes.data, nbytes) != 0:
        raise RuntimeError(f"TransferEngine.register_memory of {nbytes} bytes failed")
    return buffer


def serve(spec: dict[str, int]) -> None:
    engine = _engine()
    item_bytes, count = spec["item_bytes"], spec["count"]
    buffer = _registered(engine, item_bytes * count)
    buffer[:] = np.frombuffer(np.random.default_rng(7).bytes(buffer.nbytes), np.uint8)
    print(json.dumps({
        "session": f"{HOST}:{engine.get_rpc_port()}", "address": buffer.ctypes.data,
        "sha256": hashlib.sha256(buffer[:item_bytes].tobytes()).hexdigest(),
        "version": version("mooncake-transfer-engine-non-cuda"),
    }), flush=True)  # fmt: skip
    sys.stdin.read()  # serves until the orchestrator closes stdin


def read(spec: dict[str, object]) -> None:
    engine = _engine()
    session, remote = str(spec["session"]), int(spec["address"])  # type: ignore[call-overload]
    item_bytes, count = int(spec["item_bytes"]), int(spec["count"])  # type: ignore[call-overload]
    buffers = [_registered(engine, item_bytes) for _ in range(int(spec["max_concurrency"]))]  # type: ignore[call-overload]

    def op(w: int, n: int) -> None:
        offset = ((w + max(n, 0)) % count) * item_bytes
        if engine.transfer_sync_read(session, buffers[w].ctypes.data, remote + offset, item_bytes) != 0:
            raise RuntimeError("transfer_sync_read failed")

    op(0, 0)
    if hashlib.sha256(buffers[0].tobytes()).hexdigest() != spec["sha256"]:
        raise RuntimeError("the Transfer Engine read other bytes than were served")
    answer_cells(op, item_bytes)


def main() -> None:
    spec = json.loads(sys.stdin.readline())
    {"serve": serve, "read": read}[sys.argv[1]](spec)


if __name__ == "__main__":
    main()
