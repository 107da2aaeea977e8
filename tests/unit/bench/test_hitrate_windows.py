"""bench-hitrate's replay against a real daemon: the per-window report (lookups, hits and
the optimum's hits per WINDOW_S of simulated time, adding up to the run) and the bound on
the DRAM share of the turns that start on arrival."""

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


async def replay(address: str, work: Workload, dram_chunks: int = 64, slots: int = 2) -> dict:
    async with AsyncKVStoreClient(address) as kv:
        await kv.register_namespace(NS, **chunk_layout(CHUNK_TOKENS))
        run = Replay(
            work,
            kv,
            NodeCapacity(dram_chunks * CHUNK_BYTES, 640 * CHUNK_BYTES),
            slots=slots,
            push_hints=False,
            hint_interval_s=0.2,
            on_turn_done=lambda: None,
        )
        return (await run.run()).summary()


def run_replay(tmp_path: Path, work: Workload, dram_chunks: int = 64, slots: int = 2) -> dict:
    settings = {**DAEMON_SETTINGS, "eviction_policy": "lru"}
    with running_daemon(tmp_path, dram_bytes=1024 * 1024, ssd_bytes=1024 * 1024, settings=settings) as daemon:
        return uvloop.run(replay(daemon.address, work, dram_chunks, slots))


def test_each_window_counts_its_own_lookups_hits_and_optimum(tmp_path: Path) -> None:
    summary = run_replay(tmp_path, workload())
    first, second = summary["windows"]
    assert (first["start_s"], second["start_s"]) == (0.0, WINDOW_S)
    assert (first["lookup_blocks"], first["hit_rate"], first["optimal_hit_rate"]) == (4, 0.0, 0.0)
    assert (second["lookup_blocks"], second["hit_rate"], second["optimal_hit_rate"]) == (4, 1.0, 1.0)
    assert first["lookup_blocks"] + second["lookup_blocks"] == summary["lookup_blocks"]
    assert summary["hit_rate"] == summary["optimal_hit_rate"] == 0.5


def test_the_bound_gives_an_unannounced_turn_the_share_of_the_returning_chains_dram_holds(
    tmp_path: Path,
) -> None:
    """Three sessions store 4 chunks each and come back one after another, each on arrival
    (no queue). Against a DRAM of 4 chunks: the first back competes with 8 chunks of the
    two still to come (4 of its 4 + 8: a third), the second with 4 (a half), the last with
    none (all): 4/3 + 2 + 4 of its 12 hits."""
    sessions = [
        Session(float(i), (Turn(chain(i, 4), 2, 0.5, 0.0), Turn(chain(i, 6), 4, 0.5, 100.0 * (i + 1))))
        for i in range(3)
    ]
    summary = run_replay(tmp_path, Workload("sharegpt", CHUNK_TOKENS, sessions), dram_chunks=4, slots=3)
    assert summary["hit_blocks"] == 12 and summary["waited_share_of_hits"] == 0.0
    assert summary["started_dram_share_bound"] == round((4 / 3 + 2 + 4) / 12, 4)
    mooncake_like = Workload("mooncake", CHUNK_TOKENS, sessions, session_ids=False)
    assert run_replay(tmp_path, mooncake_like, dram_chunks=4, slots=3)["started_dram_share_bound"] is None
