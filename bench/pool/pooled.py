"""The three-node pooled replay (issue 21): ShareGPT sessions served by three daemons that
stand for three nodes (each its own directories, gRPC and data-plane ports), as islands,
as one pool and as one daemon with the three nodes' capacity (the reference): the layouts
of pooled_layouts.py. Workload, routing and capacities: pooled_workload.py (the pool holds
1.1x the working set, each node a third of that; sessions dealt 8:1:1, so the busy node
holds under half of what its sessions need). Every node: DRAM 1 MiB, the rest SSD. In the
pool, SSD evictions go to a peer, Lookup finds them there (TIER_PEER) and a read fetches
them back over the peer's data plane.

At each turn's arrival its node looks up the prompt's chunks and reads the found prefix
back (Get; a chunk counts only if its bytes arrive, so a chunk a peer no longer holds is a
miss); at its completion the node stores the turn's chunks it lacks. Hit rate = chunks
read back / chunks an earlier turn of the session stored (what a store that never evicts
would serve). Turns run one at a time in the clock's order. This replay gives hit rates;
later-turn TTFT comes from the worker replay (pooled_ttft.py), which runs the busy node's
turns through a real worker over the same layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from attnstore.kvstore_client import KVStoreClient
from bench.hitrate.workloads import CHUNK_BYTES, Workload, chunk_layout, encode, load_sharegpt
from bench.pool.pooled_layouts import LAYOUTS, NODES, layout
from bench.pool.pooled_workload import ARRIVAL, Event, deal, events, size_nodes, wanted_keys

SHAREGPT = {"conversations": 400, "sessions_per_s": 20.0, "think_s": 60.0, "seed": 0}


@dataclass
class Tally:
    stored_before: int = 0  # prompt chunks an earlier turn of the session stored
    read_back: int = 0  # of them, found and read

    @property
    def hit_rate(self) -> float:
        return self.read_back / self.stored_before if self.stored_before else 0.0


@dataclass(frozen=True)
class StoreChunks:
    """What the chunk-level replay stores: its namespace, RegisterNamespace's layout and
    each key's serialized chunk."""

    namespace: bytes
    layout: dict[str, int | str]
    encode: Callable[[bytes], bytes]


def sharegpt_chunks(workload: Workload) -> StoreChunks:
    """The hit-rate workload's own 8 KiB chunks."""
    namespace, tokens = workload.namespace, workload.chunk_tokens
    return StoreChunks(namespace, chunk_layout(tokens), lambda key: encode(namespace, key, tokens))


class WorkerTurns(Protocol):
    """The worker replay's hook: runs turn `index` of session `number` of `sessions`."""

    sessions: frozenset[int]

    def __call__(self, number: int, index: int) -> None: ...


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


def replay(
    workload: Workload, schedule: list[Event], addresses: list[str], node_of: list[int], chunks: StoreChunks,
    worker: WorkerTurns | None = None,
) -> list[Tally]:  # fmt: skip
    """Replays every session on its node (`node_of[session]` indexes `addresses`); a tally
    per address. With `worker`, its sessions' turns run through it at their arrival (not
    tallied) and the others' at the chunk level."""
    namespace = chunks.namespace
    tallies = [Tally() for _ in addresses]
    with ExitStack() as stack:
        clients = [stack.enter_context(KVStoreClient(address)) for address in addresses]
        for client in clients:
            client.register_namespace(namespace, **chunks.layout)
        for _, kind, number, index in schedule:
            node = node_of[number]
            turn, client = workload.sessions[number].turns[index], clients[node]
            if worker is not None and number in worker.sessions:
                if kind == ARRIVAL:
                    worker(number, index)
            elif kind == ARRIVAL:
                wanted = wanted_keys(workload, number, index)
                tallies[node].stored_before += len(wanted)
                tallies[node].read_back += _read_prefix(client, namespace, wanted) if wanted else 0
            else:
                new = turn.keys[client.lookup(namespace, turn.keys).prefix_length :]
                if new:  # a key stored meanwhile answers already_stored
                    client.put_chunks(namespace, [(key, chunks.encode(key)) for key in new])
    return tallies


def _total(tallies: list[Tally]) -> Tally:
    return Tally(sum(t.stored_before for t in tallies), sum(t.read_back for t in tallies))


def run_pooled(root: Path) -> dict[str, Any]:
    workload = load_sharegpt(**SHAREGPT)
    schedule = events(workload)
    sizing = size_nodes(workload, schedule)
    node_of = deal(workload, int(SHAREGPT["seed"]))
    rates: dict[str, dict[str, float]] = {}
    for name in LAYOUTS:
        with layout(root / "hits", name, sizing.node_chunks, CHUNK_BYTES) as addresses:
            tallies = replay(workload, schedule, addresses, node_of if len(addresses) > 1 else [0] * len(node_of),
                             sharegpt_chunks(workload))  # fmt: skip
        rates[name] = {"all": round(_total(tallies).hit_rate, 4)}
        if len(tallies) == len(NODES):
            rates[name] |= {NODES[i]: round(t.hit_rate, 4) for i, t in enumerate(tallies)}
        print(f"pooled replay  {name:<8} hit rate {rates[name]}", flush=True)
    return {
        "hit_rates": rates,
        "workload": workload.notes
        | {"chunks_stored": workload.working_set_bytes // CHUNK_BYTES, "turns": workload.turns},
        "working_set_chunks": sizing.working_set_chunks,
        "node_chunks": sizing.node_chunks,
        "sessions_per_node": {name: node_of.count(i) for i, name in enumerate(NODES)},
    }


def pooled_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The summary's pooled keys: the pool against the islands (every node alone) and
    against one daemon with the pool's capacity; with the worker replay, the busy node's
    later-turn TTFT (median, mean) in each layout over the pool's (above 1: the pool is faster)."""
    rates = result["hit_rates"]
    pooled, islands, big = rates["pooled"]["all"], rates["islands"]["all"], rates["one_big"]["all"]
    summary = {
        "pooled_hit_rate_vs_single_node": round(pooled / max(islands, 1e-9), 3),
        "pooled_hit_rate_vs_whole_capacity": round(pooled / max(big, 1e-9), 3),
        "pooled_hit_rates": {"pooled": pooled, "islands": islands, "one_big": big},
    }
    if busy := result.get("worker_replay", {}).get("busy_node"):
        for stat in ("p50", "mean"):
            ttft = {name: busy[name][f"ttft_ms_{stat}"] for name in busy}
            summary |= {
                f"later_turn_ttft_{stat}_islands_vs_pooled": round(ttft["islands"] / ttft["pooled"], 3),
                f"later_turn_ttft_{stat}_one_big_vs_pooled": round(ttft["one_big"] / ttft["pooled"], 3),
                f"later_turn_ttft_ms_{stat}": ttft,
            }
        summary["worker_hit_rates"] = {name: busy[name]["hit_rate"] for name in busy}
    return summary
