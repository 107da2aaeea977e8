"""The three-node pooled replay (issue 21): ShareGPT sessions served by three daemons that
stand for three nodes (each its own directories, gRPC and data-plane ports), as islands
and as one pool, and by one daemon with the three nodes' capacity (the reference).
Workload, routing and capacities: pooled_workload.py (the pool holds 1.1x the working set,
each node a third of that; sessions dealt 8:1:1, so the busy node holds under half of what
its sessions need). Every node: DRAM 1 MiB, the rest SSD.

  islands       the three daemons, no ledger: a node's SSD evictions are deleted
  pooled        the same three in one ledger (a private Redis, heartbeats every 0.2 s,
                lenders keep a 10% floor and lend up to 80%, then replace their least
                recently placed or read borrowed chunks: the daemons' defaults): SSD
                evictions go to a peer, Lookup finds them there (TIER_PEER) and a read
                fetches them back over the peer's data plane
  one_big       one daemon with the three nodes' capacity serving every session

At each turn's arrival its node looks up the prompt's chunks and reads the found prefix
back (Get; a chunk counts only if its bytes arrive, so a chunk a peer no longer holds is a
miss); at its completion the node stores the turn's chunks it lacks. Hit rate = chunks
read back / chunks an earlier turn of the session stored (what a store that never evicts
would serve). Turns run one at a time in the clock's order: hit rates, not TTFT (three
workers with a model on this 2-core machine are out of reach; docs/benchmarks.md).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from attnstore.kvstore_client import KVStoreClient
from attnstore.server.ports import free_port
from attnstore.server.redis_process import RedisProcess
from bench.hitrate.workloads import CHUNK_BYTES, Workload, chunk_layout, encode, load_sharegpt
from bench.pool.daemons import daemon
from bench.pool.pooled_workload import ARRIVAL, Event, deal, events, size_nodes, wanted_keys

MiB = 1024 * 1024
NODES = ("node-a", "node-b", "node-c")
DRAM_BYTES = MiB  # the daemon's minimum arena
SHAREGPT = {"conversations": 400, "sessions_per_s": 20.0, "think_s": 60.0, "seed": 0}
BASE_SETTINGS = {"dram_block_bytes": CHUNK_BYTES, "max_chunk_bytes": CHUNK_BYTES, "persist_on_commit": False,
                 "ssd_reserved_bytes": 0, "eviction_policy": "lru"}  # fmt: skip
# The lenders' own sessions fill under a third of their room: they keep a tenth free for
# their own node and may lend 80% (the defaults, 0.2 and 0.5, would cap what the busy
# node can borrow below what it lacks: 2 x 0.5 of a node against its 0.8 of the pool).
LEDGER_SETTINGS = {"pool_heartbeat_seconds": 0.2, "pool_own_floor_fraction": 0.1, "pool_max_lent_fraction": 0.8}


@dataclass
class Tally:
    stored_before: int = 0  # prompt chunks an earlier turn of the session stored
    read_back: int = 0  # of them, found and read

    @property
    def hit_rate(self) -> float:
        return self.read_back / self.stored_before if self.stored_before else 0.0


def _read_prefix(client: KVStoreClient, namespace: bytes, keys: tuple[bytes, ...]) -> int:
    """How many leading `keys` the node serves: looked up, then read back. A read that meets
    a chunk its peer no longer holds drops that chunk from the index, so looking up again
    finds the prefix before it (a worker recomputes from there)."""
    for _ in range(len(keys) + 1):
        found = client.lookup(namespace, keys, promote=True).prefix_length
        if found == 0:
            return 0
        try:
            client.get_whole_chunks(namespace, keys[:found])
            return found
        except grpc.aio.AioRpcError as exc:  # a peer's copy was gone: dropped from the index now
            if exc.code() not in (grpc.StatusCode.DATA_LOSS, grpc.StatusCode.NOT_FOUND):
                raise
    return 0


def replay(workload: Workload, schedule: list[Event], addresses: list[str], node_of: list[int]) -> list[Tally]:
    """Replays every session on its node (`node_of[session]` indexes `addresses`); a tally
    per address."""
    namespace = workload.namespace
    tallies = [Tally() for _ in addresses]
    with ExitStack() as stack:
        clients = [stack.enter_context(KVStoreClient(address)) for address in addresses]
        for client in clients:
            client.register_namespace(namespace, **chunk_layout(workload.chunk_tokens))
        for _, kind, number, index in schedule:
            node = node_of[number]
            turn, client = workload.sessions[number].turns[index], clients[node]
            if kind == ARRIVAL:
                wanted = wanted_keys(workload, number, index)
                tallies[node].stored_before += len(wanted)
                tallies[node].read_back += _read_prefix(client, namespace, wanted) if wanted else 0
            else:
                new = turn.keys[client.lookup(namespace, turn.keys).prefix_length :]
                if new:  # a key stored meanwhile answers already_stored
                    client.put_chunks(namespace, [(key, encode(namespace, key, workload.chunk_tokens)) for key in new])
    return tallies


def _total(tallies: list[Tally]) -> Tally:
    return Tally(sum(t.stored_before for t in tallies), sum(t.read_back for t in tallies))


def _node_settings(node_chunks: int, nodes: int) -> dict[str, object]:
    total = node_chunks * CHUNK_BYTES * nodes
    return {**BASE_SETTINGS, "dram_capacity_bytes": DRAM_BYTES * nodes, "ssd_capacity_bytes": total - DRAM_BYTES * nodes}


def run_pooled(root: Path) -> dict[str, Any]:
    workload = load_sharegpt(**SHAREGPT)
    schedule = events(workload)
    sizing = size_nodes(workload, schedule)
    node_of = deal(workload, int(SHAREGPT["seed"]))
    node = _node_settings(sizing.node_chunks, 1)
    if int(str(node["ssd_capacity_bytes"])) < MiB:
        raise ValueError(f"a node of {sizing.node_chunks} chunks leaves its SSD under the daemon's 1 MiB minimum")
    rates: dict[str, dict[str, float]] = {}

    def record(name: str, tallies: list[Tally]) -> None:
        rates[name] = {"all": round(_total(tallies).hit_rate, 4)}
        if len(tallies) == len(NODES):
            rates[name] |= {NODES[i]: round(t.hit_rate, 4) for i, t in enumerate(tallies)}
        print(f"pooled replay  {name:<8} hit rate {rates[name]}", flush=True)

    with ExitStack() as stack:
        daemons = [stack.enter_context(daemon(root, f"island-{name}", node)) for name in NODES]
        record("islands", replay(workload, schedule, [d.address for d in daemons], node_of))
    with ExitStack() as stack:
        redis_server = RedisProcess(root / "pool-redis")
        redis_server.start()
        stack.callback(redis_server.stop)
        # A node may place on peers what the other two hold: its SSD's size (the budget
        # before) capped the busy node's placements below what it lacks at 8:1:1.
        lendable = (len(NODES) - 1) * sizing.node_chunks * CHUNK_BYTES
        pooled = {**node, **LEDGER_SETTINGS, "pool_redis_url": redis_server.url, "pool_capacity_bytes": lendable}
        daemons = [
            stack.enter_context(daemon(root, f"pooled-{name}", {**pooled, "pool_node": name, "data_plane_port": free_port()}))
            for name in NODES
        ]  # fmt: skip
        record("pooled", replay(workload, schedule, [d.address for d in daemons], node_of))
    with ExitStack() as stack:
        big = stack.enter_context(daemon(root, "one-big", _node_settings(sizing.node_chunks, len(NODES))))
        record("one_big", replay(workload, schedule, [big.address], [0] * len(node_of)))
    return {
        "hit_rates": rates,
        "workload": workload.notes | {"chunks_stored": workload.working_set_bytes // CHUNK_BYTES, "turns": workload.turns},
        "working_set_chunks": sizing.working_set_chunks,
        "node_chunks": sizing.node_chunks,
        "sessions_per_node": {name: node_of.count(i) for i, name in enumerate(NODES)},
    }


def pooled_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The summary's pooled keys: the pool against the islands (every node alone) and
    against one daemon with the pool's capacity."""
    rates = result["hit_rates"]
    pooled, islands, big = rates["pooled"]["all"], rates["islands"]["all"], rates["one_big"]["all"]
    return {
        "pooled_hit_rate_vs_single_node": round(pooled / max(islands, 1e-9), 3),
        "pooled_hit_rate_vs_whole_capacity": round(pooled / max(big, 1e-9), 3),
        "pooled_hit_rates": {"pooled": pooled, "islands": islands, "one_big": big},
    }
