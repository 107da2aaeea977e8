"""Mooncake Store for bench-pool: runs INSIDE the Mooncake venv (bench/peers/install.py),
started by bench/pool/peer_rows.py beside a `mooncake_master` (its HTTP metadata
server on; one per chunk size), one process per side, over TCP on loopback.

    serve  a store that mounts a memory segment for the pool and puts `count` chunks of
           random bytes (keys chunk-0..); prints the first chunk's sha256 and the
           package's version, then waits for stdin to close
    read   a client that mounts no memory of its own; its workers each own a registered
           buffer of one chunk; per cell line ({"concurrency", "seconds"}) every worker
           keeps one `get_into` of a whole chunk in flight (closed loop,
           bench/pool/timing.py) and one JSON row answers

The bytes of every Get therefore cross from the serving process to the reading one, as
the data plane's do. The first read is checked against the served bytes first.

    <mooncake venv>/bin/python -m bench.pool.mooncake_store_driver serve|read < JSON lines   # from the repository root
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib.metadata import version

import numpy as np
from mooncake.store import MooncakeDistributedStore

from bench.pool.driver_cells import answer_cells

HOST = "127.0.0.1"
_MiB = 1024 * 1024


def _store(spec: dict[str, object], segment_bytes: int, buffer_bytes: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    metadata = f"http://{spec['metadata']}/metadata"
    if store.setup(HOST, metadata, segment_bytes, buffer_bytes, "tcp", "", str(spec["master"])) != 0:
        raise RuntimeError("MooncakeDistributedStore.setup failed (see the log)")
    return store


def serve(spec: dict[str, object]) -> None:
    item_bytes, count = int(spec["item_bytes"]), int(spec["count"])  # type: ignore[call-overload]
    store = _store(spec, 2 * item_bytes * count + 64 * _MiB, 64 * _MiB)
    rng = np.random.default_rng(7)
    first = b""
    for index in range(count):
        data = rng.bytes(item_bytes)
        first = first or data
        if store.put(f"chunk-{index}", data) != 0:
            raise RuntimeError(f"put of chunk-{index} failed")
    print(json.dumps({
        "sha256": hashlib.sha256(first).hexdigest(), "version": version("mooncake-transfer-engine-non-cuda"),
    }), flush=True)  # fmt: skip
    sys.stdin.read()  # serves until the orchestrator closes stdin
    store.close()


def read(spec: dict[str, object]) -> None:
    item_bytes, count = int(spec["item_bytes"]), int(spec["count"])  # type: ignore[call-overload]
    workers = int(spec["max_concurrency"])  # type: ignore[call-overload]
    store = _store(spec, 0, 64 * _MiB)
    buffers = [np.zeros(item_bytes, np.uint8) for _ in range(workers)]
    for buffer in buffers:
        if store.register_buffer(buffer.ctypes.data, item_bytes) != 0:
            raise RuntimeError("register_buffer failed")

    def op(w: int, n: int) -> None:
        key = f"chunk-{(w + max(n, 0)) % count}"
        got = store.get_into(key, buffers[w].ctypes.data, item_bytes)
        if got != item_bytes:
            raise RuntimeError(f"get_into of {key} answered {got}")

    op(0, 0)
    if hashlib.sha256(buffers[0].tobytes()).hexdigest() != spec["sha256"]:
        raise RuntimeError("Mooncake Store read other bytes than were put")
    answer_cells(op, item_bytes)
    store.close()


def main() -> None:
    spec = json.loads(sys.stdin.readline())
    {"serve": serve, "read": read}[sys.argv[1]](spec)


if __name__ == "__main__":
    main()
