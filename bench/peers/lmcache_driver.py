"""LMCache's side of the store benchmark: runs INSIDE the LMCache venv (bench/peers/install.py),
started by bench/peers/store.py, and prints its rows as JSON on the last line of stdout.

The clients are LMCache's own: `LMCServerConnector`, the `lm://` remote connector that an
LMCache engine uses to talk to its standalone server (`lmcache_server <host> <port> cpu`),
each with its own socket and its own event-loop thread, over one `LocalCPUBackend`
whose allocator hands out the memory objects (KV_2LTD tensors: [2, layers, tokens,
kv_heads * head_dim] in bf16, the same KV as our chunk minus its 4 KB header).

    put  connector.put(key, obj) then connector.exists(key): LMCache's PUT has no reply,
         so the EXIST round trip (served in order on the same connection) is what tells
         the client the server holds the chunk, as our CommitPut does
    get  connector.get(key) into a memory object from the allocator, then freed

Timing, rounds and budgets are the daemon benchmark's (bench/common/harness.py): one thread per client,
one request in flight each, the first round is warm-up. It measures one cell per request
on stdin, so the orchestrator can interleave LMCache's cells with the daemon's.

    <lmcache venv>/bin/python -m bench.peers.lmcache_driver < cells (JSON lines)   # from the repository root
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
from collections.abc import Coroutine
from importlib.metadata import version
from typing import Any

import numpy as np
import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector.lm_connector import LMCServerConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

from bench.common.harness import Budget, run_threads
from bench.peers.report import LMCACHE

MODEL = "SmolLM2-135M-Instruct"


class Client:
    """One connector on its own event loop: LMCServerConnector's calls block their loop
    (blocking socket I/O inside coroutines), so clients must not share one."""

    def __init__(self, host: str, port: int, backend: LocalCPUBackend) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.connector = LMCServerConnector(host, port, self.loop, backend)
        # Without it a small EXIST (or PUT header) after a PUT's bytes waits for the server's
        # delayed ACK (~40 ms): LMCache's connector leaves Nagle on; we give it its best case.
        self.connector.client_socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.call(self.connector.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def make_objects(backend: LocalCPUBackend, pool: dict[str, Any]) -> list[MemoryObj]:
    """The pool's chunks as LMCache memory objects: each holds the leading bytes of our
    encoded chunk (its header and K/V layers), the same bytes the daemon stores."""
    shape = torch.Size([2, pool["layers"], pool["chunk_tokens"], pool["kv_heads"] * pool["head_dim"]])
    raw = np.fromfile(pool["file"], dtype=np.uint8).reshape(pool["count"], pool["chunk_bytes"])
    objects = []
    for chunk in raw:
        obj = backend.allocate(shape, torch.bfloat16, MemoryFormat.KV_2LTD)
        if obj is None:
            raise RuntimeError("LMCache's allocator is full: raise max_local_cpu_size")
        view = obj.tensor.view(torch.uint8).reshape(-1).numpy()
        view[:] = chunk[: view.size]
        objects.append(obj)
    return objects


class Pool:
    """One chunk size: its memory objects and keys, and whether the server holds them."""

    def __init__(self, backend: LocalCPUBackend, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.objects = make_objects(backend, spec)
        self.keys = [
            CacheEngineKey(MODEL, 1, 0, spec["key_base"] + i, torch.bfloat16)
            for i in range(len(self.objects))
        ]
        self.stored = False


def run_cell(clients: list[Client], pool: Pool, op: str, budget: Budget) -> dict[str, Any]:
    """One timed cell: `op` over the pool's chunks by every client (harness.run_threads)."""
    keys, objects = pool.keys, pool.objects

    def put(w: int, i: int) -> None:
        clients[w].call(clients[w].connector.put(keys[i], objects[i]))
        if not clients[w].call(clients[w].connector.exists(keys[i])):
            raise RuntimeError(f"chunk {i} is not on the server after its PUT")

    def get(w: int, i: int) -> None:
        obj = clients[w].call(clients[w].connector.get(keys[i]))
        if obj is None:
            raise RuntimeError(f"chunk {i} missing on the server")
        obj.ref_count_down()  # back to the allocator, as the engine does once it has used it

    if op == "get" and not pool.stored:  # untimed: a Get cell reads a pool stored once
        for i in range(len(keys)):
            put(0, i)
        check(clients[0], keys[-1], objects[-1])
    result = run_threads(
        put if op == "put" else get,
        item_bytes=objects[0].get_size(),
        count=len(objects),
        concurrency=len(clients),
        budget=budget,
    )
    pool.stored = True
    return {
        "path": LMCACHE,
        "op": op,
        "size": pool.spec["label"],
        "chunk_bytes": objects[0].get_size(),
        "chunk_tokens": pool.spec["chunk_tokens"],
        "concurrency": len(clients),
        **result.as_dict(),
    }


def check(client: Client, key: CacheEngineKey, expected: MemoryObj) -> None:
    """The server returns the bytes that were stored, before any Get is timed."""
    got = client.call(client.connector.get(key))
    if got is None or not torch.equal(got.tensor.view(torch.uint8), expected.tensor.view(torch.uint8)):
        raise RuntimeError("LMCache's server returned other bytes than were stored")
    got.ref_count_down()


def make_backend(spec: dict[str, Any]) -> LocalCPUBackend:
    """LMCache's CPU backend, whose allocator holds every pool plus one in-flight Get per client."""
    pools = spec["pools"]
    largest = max(pools, key=lambda p: p["chunk_bytes"])
    pool_bytes = sum(p["count"] * p["chunk_bytes"] for p in pools)
    cpu_gib = (pool_bytes + (spec["max_concurrency"] + 2) * largest["chunk_bytes"]) * 1.5 / 2**30
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=largest["chunk_tokens"], local_cpu=True, max_local_cpu_size=cpu_gib
    )
    metadata = LMCacheMetadata(
        model_name=MODEL,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(largest["layers"], 2, largest["chunk_tokens"], largest["kv_heads"], largest["head_dim"]),
    )
    return LocalCPUBackend(config, metadata, dst_device="cpu")


def main() -> None:
    """First stdin line: the set-up (server, pools); then one cell a line
    ({"size", "concurrency", "op", "budget"}), answered by one JSON row a line on stdout."""
    spec = json.loads(sys.stdin.readline())
    backend = make_backend(spec)
    pools = {p["label"]: Pool(backend, p) for p in spec["pools"]}
    clients: list[Client] = []
    print(json.dumps({"ready": True, "lmcache": version("lmcache"), "torch": torch.__version__}), flush=True)
    try:
        for line in sys.stdin:
            cell = json.loads(line)
            if len(clients) != cell["concurrency"]:  # a new client set per concurrency
                for client in clients:
                    client.close()
                clients = [Client(spec["host"], spec["port"], backend) for _ in range(cell["concurrency"])]
            row = run_cell(clients, pools[cell["size"]], cell["op"], Budget(**cell["budget"]))
            print(json.dumps(row), flush=True)
    finally:
        for client in clients:
            client.close()


if __name__ == "__main__":
    main()
