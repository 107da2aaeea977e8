"""The reading side of a peer's driver (mooncake_driver.py, mooncake_store_driver.py), in
the peer's venv: once its first read was checked, it says ready, then answers each cell
line ({"concurrency", "seconds"}) with one JSON row of a closed-loop run (timing.py)."""

from __future__ import annotations

import json
import sys

from bench.pool.timing import SyncOp, run_threads


def answer_cells(op: SyncOp, item_bytes: int) -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cell = json.loads(line)
        result = run_threads(op, cell["concurrency"], cell["seconds"], item_bytes)
        print(json.dumps({"ops": result.ops, "seconds": result.seconds, "item_bytes": item_bytes,
                          "p50_ms": result.p50_ms, "p99_ms": result.p99_ms}), flush=True)  # fmt: skip
