"""The issue's calibration, reproduced in process: one tier, Mooncake's first minutes,
LRU, the daemon's predictive order (its policy object, no scheduler predictions), the
calibration's learned hit density (learned_density.py) and LHD as the issue states it
(lhd.py: learned from its own chunks' lives only), each as the share of the LRU-to-optimum
gap it closes, on two schedules of the same requests:

- `arrival`: each request looks up its chain and stores it at its arrival (no queue, no
  service time): the setup the issue's figures fit (LRU about 4.5% and 8.5%, optimum 23%
  and 28% at 0.5% + 5% and 1% + 10%);
- `queued`: as bench-hitrate replays them (sim.py): requests wait for one of the worker
  slots in arrival order, look up when they start and store what they computed when
  they end (service time = prefill + decode).

`python -m bench.hitrate.calibration` (45 s here at load 6 before the LHD column; four capacities
took 14 minutes at load 14 with it): a table, the summary as the
last line (JSON), and bench/results/<--results-name>.json. Nothing reads the future but
the optimum: the policies see each request when it comes.
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.results import print_report, save_results
from bench.hitrate.learned_density import LearnedDensity
from bench.hitrate.lhd import LHD
from bench.hitrate.optimal import Lookup, Offer, optimal_hits
from bench.hitrate.workloads import CHUNK_BYTES, MOONCAKE_TRACE, Workload, load_mooncake
from kvstore_daemon.eviction import make_policy
from kvstore_daemon.hints import HintBook

CAPACITIES = (0.055, 0.11)  # one tier of DRAM + SSD: 0.5% + 5% and 1% + 10% of the working set
POLICIES = ("lru", "daemon", "learned", "lhd")


@dataclass(frozen=True)
class Step:
    time_s: float
    job: int
    keys: tuple[bytes, ...]
    lookup: bool  # a turn's lookup of its prompt, else its store of every chunk of the turn


def arrival_schedule(workload: Workload) -> list[Step]:
    steps = []
    for job, session in enumerate(workload.sessions):
        turn = session.turns[0]
        steps += [
            Step(session.arrival_s, job, turn.keys[: turn.prompt_blocks], True),
            Step(session.arrival_s, job, turn.keys, False),
        ]
    return steps


def queued_schedule(workload: Workload, slots: int) -> list[Step]:
    """First come, first served by `slots` workers (Mooncake's requests are one turn each)."""
    free = [0.0] * slots  # when each worker is free
    steps = []
    for job, session in enumerate(workload.sessions):
        turn = session.turns[0]
        start = max(session.arrival_s, heapq.heappop(free))
        heapq.heappush(free, start + turn.service_s)
        steps += [
            Step(start, job, turn.keys[: turn.prompt_blocks], True),
            Step(start + turn.service_s, job, turn.keys, False),
        ]
    steps.sort(
        key=lambda step: (step.time_s, step.lookup)
    )  # at one instant, a turn's end frees its slot first
    return steps


class _Store:
    """One tier of `capacity` chunks under a policy's victim choice; chains from the stores."""

    def __init__(self, capacity: int, policy: str) -> None:
        self.capacity = capacity
        self.held: set[bytes] = set()
        self.children: dict[bytes, set[bytes]] = {}
        self.now = 0.0
        self._lru: OrderedDict[bytes, None] = OrderedDict()
        self._learned = LearnedDensity() if policy == "learned" else None
        self._lhd = LHD() if policy == "lhd" else None
        self._daemon = make_policy("predictive", HintBook(), lambda: self.now) if policy == "daemon" else None
        self._policy = policy

    def lookup(self, keys: tuple[bytes, ...]) -> int:
        hit = next((i for i, key in enumerate(keys) if key not in self.held), len(keys))
        if self._learned is not None:
            self._learned.now = self.now
            self._learned.advance()
            for key in keys:
                self._learned.named(key)
        if self._daemon is not None:
            for key in keys[:hit]:
                self._daemon.on_access(key)
            self._daemon.on_chain(keys[:hit])  # as the daemon does with a lookup's stored prefix
            self._daemon.on_miss(keys[hit:])  # and the keys it named beyond
        elif self._lhd is not None:
            self._lhd.now = self.now
            for key in keys[:hit]:
                self._lhd.hit(key)
        elif self._learned is None:
            for key in keys[:hit]:
                self._lru.move_to_end(key)
        return hit

    def store(self, keys: tuple[bytes, ...], start: int) -> None:
        """Stores what the turn computed: its chunks past the hit prefix."""
        for depth in range(start, len(keys)):
            key = keys[depth]
            if depth:
                self.children.setdefault(keys[depth - 1], set()).add(key)
            if key in self.held:
                continue
            while len(self.held) >= self.capacity:
                self._evict(self._victim())
            self.held.add(key)
            if self._learned is not None:
                self._learned.stored(key, depth)
            elif self._lhd is not None:
                self._lhd.now = self.now
                self._lhd.stored(key, depth)
            elif self._daemon is not None:
                self._daemon.on_insert(key)
            else:
                self._lru[key] = None

    def _victim(self) -> bytes:
        if self._learned is not None:
            return self._learned.victim(self.children)
        if self._lhd is not None:
            return self._lhd.victim(self.children)
        if self._daemon is not None:
            return next(iter(self._daemon.victims()))
        return next(iter(self._lru))

    def _evict(self, key: bytes) -> None:
        self.held.discard(key)
        if self._learned is not None:
            self._learned.removed(key)
        elif self._lhd is not None:
            self._lhd.removed(key)
        elif self._daemon is not None:
            self._daemon.on_remove(key)
        else:
            del self._lru[key]


def lookup_hits(steps: list[Step], capacity: int, policy: str) -> Iterator[int]:
    """Each lookup's hit prefix, in the schedule's order."""
    store = _Store(capacity, policy)
    prefix: dict[int, int] = {}  # job -> its hit prefix
    for step in steps:
        store.now = step.time_s
        if step.lookup:
            prefix[step.job] = store.lookup(step.keys)
            yield prefix[step.job]
        else:
            store.store(step.keys, prefix.pop(step.job))


def hit_rate(steps: list[Step], capacity: int, policy: str) -> float:
    return sum(lookup_hits(steps, capacity, policy)) / sum(len(step.keys) for step in steps if step.lookup)


def optimal_rate(steps: list[Step], capacity: int) -> float:
    schedule = [
        Lookup(step.keys) if step.lookup else Offer(tuple((key, d) for d, key in enumerate(step.keys)))
        for step in steps
    ]
    looked = sum(len(step.keys) for step in steps if step.lookup)
    return optimal_hits(schedule, capacity, admit_on_lookup=False) / looked


def save_run(name: str, started: float, load_before: tuple[float, float, float], **fields: Any) -> None:
    """bench/results/<name>.json: `fields`, the load average around the run and its seconds."""
    load = {"before": load_before, "after": os.getloadavg()}
    save_results(
        name, {**fields, "loadavg_1_5_15min": load, "run_seconds": round(time.monotonic() - started, 1)}
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mooncake-trace", type=Path, default=MOONCAKE_TRACE)
    parser.add_argument("--mooncake-minutes", type=float, default=10.0)
    parser.add_argument(
        "--capacities",
        nargs="+",
        type=float,
        default=list(CAPACITIES),
        help="one tier's capacity as a fraction of the working set",
    )
    parser.add_argument("--results-name", default="hitrate-calibration")
    args = parser.parse_args(argv)
    started, load_before = time.monotonic(), os.getloadavg()
    workload = load_mooncake(args.mooncake_minutes, args.mooncake_trace)
    working_set = workload.working_set_bytes // CHUNK_BYTES
    schedules: dict[str, Callable[[], list[Step]]] = {
        "arrival": lambda: arrival_schedule(workload),
        "queued": lambda: queued_schedule(workload, math.ceil(workload.mean_service_demand())),
    }
    rows: list[dict[str, Any]] = []
    for name, make in schedules.items():
        steps = make()
        for fraction in args.capacities:
            capacity = int(working_set * fraction)
            row: dict[str, Any] = {
                "schedule": name,
                "capacity_fraction": fraction,
                "capacity_chunks": capacity,
                "optimal": round(optimal_rate(steps, capacity), 4),
            }
            for policy in POLICIES:
                row[policy] = round(hit_rate(steps, capacity, policy), 4)
            for policy in POLICIES[1:]:
                row[f"{policy}_gap_closed"] = round(
                    (row[policy] - row["lru"]) / (row["optimal"] - row["lru"]), 3
                )
            rows.append(row)
    summary = {
        f"{r['schedule']}_{r['capacity_fraction']:g}_{p}_gap_closed": r[f"{p}_gap_closed"]
        for r in rows
        for p in POLICIES[1:]
    }
    save_run(
        args.results_name, started, load_before, summary=summary, results=rows, working_set_chunks=working_set
    )
    header = (
        "| schedule, one tier | LRU | daemon's order | learned density | LHD | optimum "
        "| gap closed: daemon / learned / LHD |"
    )
    lines = [header, "|---|---|---|---|---|---|---|"] + [
        f"| {r['schedule']} {r['capacity_fraction'] * 100:g}% | {r['lru']:.2%} | {r['daemon']:.2%} | "
        f"{r['learned']:.2%} | {r['lhd']:.2%} | {r['optimal']:.2%} | {r['daemon_gap_closed']:.1%} / "
        f"{r['learned_gap_closed']:.1%} / {r['lhd_gap_closed']:.1%} |"
        for r in rows
    ]
    print_report("\n".join(lines), [], summary)


if __name__ == "__main__":
    main()
