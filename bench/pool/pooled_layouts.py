"""The pooled replay's three layouts of daemons, each started for one replay and stopped
after it: the same sizes serve the chunk-level replay (8 KiB chunks) and the worker replay
(the tiny model's chunks).

  islands   three daemons, no ledger: a node's SSD evictions are deleted
  pooled    the same three in one ledger (a private Redis, heartbeats every 0.2 s, lenders
            keep a 10% floor and lend up to 80%, then replace their least recently placed
            or read borrowed chunks: the daemons' defaults)
  one_big   one daemon with the three nodes' capacity
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from attnstore.server.ports import free_port
from attnstore.server.redis_process import RedisProcess
from bench.pool.daemons import daemon

MiB = 1024 * 1024
NODES = ("node-a", "node-b", "node-c")
LAYOUTS = ("islands", "pooled", "one_big")
DRAM_BYTES = MiB  # the daemon's minimum arena: 128 of the hit-rate replay's chunks
BASE_SETTINGS = {"persist_on_commit": False, "ssd_reserved_bytes": 0, "eviction_policy": "lru"}
# The lenders' own sessions fill under a third of their room: they keep a tenth free for
# their own node and may lend 80% (the defaults, 0.2 and 0.5, would cap what the busy
# node can borrow below what it lacks: 2 x 0.5 of a node against its 0.8 of the pool).
LEDGER_SETTINGS = {
    "pool_heartbeat_seconds": 0.2,
    "pool_own_floor_fraction": 0.1,
    "pool_max_lent_fraction": 0.8,
}


def node_settings(node_chunks: int, chunk_bytes: int, dram_bytes: int, nodes: int = 1) -> dict[str, object]:
    """Daemon settings for `nodes` nodes' capacity of `node_chunks` chunks each:
    `dram_bytes` of DRAM a node, the rest SSD."""
    total = node_chunks * chunk_bytes * nodes
    if total - dram_bytes * nodes < MiB:
        raise ValueError(f"a node of {node_chunks} chunks leaves its SSD under the daemon's 1 MiB minimum")
    return {**BASE_SETTINGS, "dram_block_bytes": chunk_bytes, "max_chunk_bytes": chunk_bytes,
            "dram_capacity_bytes": dram_bytes * nodes, "ssd_capacity_bytes": total - dram_bytes * nodes}  # fmt: skip


@contextmanager
def layout(
    root: Path, name: str, node_chunks: int, chunk_bytes: int, dram_bytes: int = DRAM_BYTES
) -> Iterator[list[str]]:
    """The gRPC addresses of layout `name`'s daemons (one per node; one_big: one), started
    under `root / name`. A node's DRAM must hold the longest prefix one read loads from SSD."""
    node = node_settings(node_chunks, chunk_bytes, dram_bytes)
    with ExitStack() as stack:
        if name == "islands":
            daemons = [stack.enter_context(daemon(root, f"{name}-{n}", node)) for n in NODES]
        elif name == "pooled":
            redis_server = RedisProcess(root / f"{name}-redis")
            redis_server.start()
            stack.callback(redis_server.stop)
            # A node may place on peers what the other two hold: its SSD's size (the budget
            # before) capped the busy node's placements below what it lacks at 8:1:1.
            lendable = (len(NODES) - 1) * node_chunks * chunk_bytes
            pooled = {
                **node,
                **LEDGER_SETTINGS,
                "pool_redis_url": redis_server.url,
                "pool_capacity_bytes": lendable,
            }
            daemons = [
                stack.enter_context(daemon(root, f"{name}-{n}", {**pooled, "pool_node": n, "data_plane_port": free_port()}))
                for n in NODES
            ]  # fmt: skip
        else:
            daemons = [
                stack.enter_context(
                    daemon(root, name, node_settings(node_chunks, chunk_bytes, dram_bytes, len(NODES)))
                )
            ]
        yield [d.address for d in daemons]
