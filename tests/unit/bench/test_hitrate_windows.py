"""bench-hitrate's per-window report: a replay against a real daemon counts lookups, hits
and the optimum's hits per WINDOW_S of simulated time, and the windows add up to the run."""

from __future__ import annotations

from pathlib import Path

import uvloop
from running_daemon import running_daemon

from attnstore.chunks.keys import chunk_key
from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore_scheduler.lookahead import NodeCapacity
from bench.hitrate.run import DAEMON_SETTINGS
from bench.hitrate.sim import WINDOW_S, Replay
from bench.hitrate.workloads import CHUNK_BYTES, Session, Turn, Workload, chunk_layout, namespace_for

CHUNK_TOKENS = 256
NS = namespace_for(CHUNK_TOKENS)


def chain(session: int, length: int) -> tuple[bytes, ...]:
    keys: list[bytes] = []
    for index in range(length):
        keys.append(chunk_key(NS, keys[-1] if keys else None, [session, index]))
    return tuple(keys)


def workload() -> Workload:
    """Two first turns in the first window (nothing stored yet: no hit); session 0 comes
    back in the second window with its 4 stored chunks as its prompt's first 4."""
    back = Turn(chain(0, 8), 4, 0.5, WINDOW_S + 100.0)
    return Workload(
        "sharegpt",
        CHUNK_TOKENS,
        [
            Session(0.0, (Turn(chain(0, 4), 2, 0.5, 0.0), back)),
            Session(1.0, (Turn(chain(1, 4), 2, 0.5, 0.0),)),
        ],
    )


async def replay(address: str) -> dict:
    async with AsyncKVStoreClient(address) as kv:
        await kv.register_namespace(NS, **chunk_layout(CHUNK_TOKENS))
        run = Replay(
            workload(),
            kv,
            NodeCapacity(64 * CHUNK_BYTES, 640 * CHUNK_BYTES),
            slots=2,
            push_hints=False,
            hint_interval_s=0.2,
            on_turn_done=lambda: None,
        )
        return (await run.run()).summary()


def test_each_window_counts_its_own_lookups_hits_and_optimum(tmp_path: Path) -> None:
    settings = {**DAEMON_SETTINGS, "eviction_policy": "lru"}
    with running_daemon(tmp_path, dram_bytes=1024 * 1024, ssd_bytes=1024 * 1024, settings=settings) as daemon:
        summary = uvloop.run(replay(daemon.address))
    first, second = summary["windows"]
    assert (first["start_s"], second["start_s"]) == (0.0, WINDOW_S)
    assert (first["lookup_blocks"], first["hit_rate"], first["optimal_hit_rate"]) == (4, 0.0, 0.0)
    assert (second["lookup_blocks"], second["hit_rate"], second["optimal_hit_rate"]) == (4, 1.0, 1.0)
    assert first["lookup_blocks"] + second["lookup_blocks"] == summary["lookup_blocks"]
    assert summary["hit_rate"] == summary["optimal_hit_rate"] == 0.5
