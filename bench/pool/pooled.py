"""The pooled replay: multi-turn sessions against one daemon whose tiers hold about half
the working set, alone, then with two lenders in the pool's ledger (each lends what it
has above its floor), and a reference daemon with three nodes' capacity.

Each turn looks up its session's whole chain (a hit is a chunk found in any tier, the
peer's included) and then stores its new chunks. A seeded random order interleaves the
sessions' turns, so later turns find their history only if it survived the other
sessions' writes. Daemon-level: hit rates only (TTFT needs the worker's model).
"""

from __future__ import annotations

import random
from contextlib import ExitStack
from pathlib import Path

from attnstore.chunks.format import encode_chunk
from attnstore.chunks.keys import chunk_key
from attnstore.kvstore_client import KVStoreClient
from attnstore.server.ports import free_port
from attnstore.server.redis_process import RedisProcess
from bench.pool.daemons import daemon
from kvstore_daemon.launcher import DaemonProcess

KiB = 1024
NAMESPACE = b"pool-replay-ns.."
LAYOUT = {"num_layers": 8, "kv_heads": 2, "head_dim": 64, "chunk_tokens": 16, "dtype": "float16"}
NODE = {"dram_capacity_bytes": 1024 * KiB, "dram_block_bytes": 128 * KiB, "ssd_capacity_bytes": 2048 * KiB}
SESSIONS, TURNS, CHUNKS_PER_TURN = 8, 5, 2  # 80 chunks of 68 KiB (5.3 MiB): more than a node, less than three


def _chunk(session: int, index: int, parent: bytes | None) -> tuple[bytes, bytes]:
    tokens = [session * 1000 + index] * LAYOUT["chunk_tokens"]
    key = chunk_key(NAMESPACE, parent, tokens)
    half = LAYOUT["kv_heads"] * LAYOUT["chunk_tokens"] * LAYOUT["head_dim"] * 2
    rng = random.Random(f"{session}/{index}")
    layers = [(rng.randbytes(half), rng.randbytes(half)) for _ in range(LAYOUT["num_layers"])]
    return key, encode_chunk(
        namespace=NAMESPACE, key=key, dtype=LAYOUT["dtype"], kv_heads=LAYOUT["kv_heads"], tokens=LAYOUT["chunk_tokens"],
        head_dim=LAYOUT["head_dim"], base_position=index * LAYOUT["chunk_tokens"], layers=layers,
    )  # fmt: skip


def _replay(address: str) -> float:
    """The share of earlier turns' chunks found at each later turn."""
    order = [s for s in range(SESSIONS) for _ in range(TURNS)]
    random.Random(7).shuffle(order)
    chains: dict[int, list[bytes]] = {s: [] for s in range(SESSIONS)}
    wanted = found = 0
    with KVStoreClient(address) as client:
        client.register_namespace(NAMESPACE, **LAYOUT)
        for session in order:
            chain = chains[session]
            if chain:
                wanted += len(chain)
                found += client.lookup(NAMESPACE, chain).prefix_length
            for _ in range(CHUNKS_PER_TURN):
                key, data = _chunk(session, len(chain), chain[-1] if chain else None)
                client.put_chunks(NAMESPACE, [(key, data)], durable=True)
                chain.append(key)
    return found / wanted if wanted else 0.0


def _start(stack: ExitStack, root: Path, name: str, settings: dict[str, object]) -> DaemonProcess:
    base = {"ssd_reserved_bytes": 0, "max_chunk_bytes": 512 * KiB, "eviction_policy": "lru"}
    return stack.enter_context(daemon(root, name, {**base, **settings}))


def run_pooled(root: Path) -> dict[str, float]:
    rates: dict[str, float] = {}
    with ExitStack() as stack:
        rates["single_node"] = _replay(_start(stack, root, "single", NODE).address)
    with ExitStack() as stack:
        whole = {k: v * 3 if k.endswith("capacity_bytes") else v for k, v in NODE.items()}
        rates["one_daemon_with_the_pools_capacity"] = _replay(_start(stack, root, "whole", whole).address)
    with ExitStack() as stack:
        redis_server = RedisProcess(root / "pool-redis")
        redis_server.start()
        stack.callback(redis_server.stop)
        ledger = {"pool_redis_url": redis_server.url, "pool_heartbeat_seconds": 0.5, "pool_own_floor_fraction": 0.0,
                  "pool_max_lent_fraction": 1.0}  # fmt: skip
        for name in ("lender1", "lender2"):
            _start(stack, root, name, {**NODE, **ledger, "data_plane_port": free_port()})
        borrower = _start(stack, root, "borrower", {**NODE, **ledger, "pool_capacity_bytes": 64 * 1024 * KiB})
        rates["pooled"] = _replay(borrower.address)
    return rates
