"""Timing harness shared by every path of the daemon benchmark.

A cell runs one operation over a pool of `count` items in rounds: each round touches
every item once, split between `concurrency` workers that each keep one request in
flight. The first round is warm-up and is not recorded; `between_rounds` (e.g. deleting
what a Put round stored) runs outside the timed windows. Throughput is the bytes moved
in the timed rounds over their wall time; latencies are per operation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

SyncOp = Callable[[int, int], object]  # (worker, item index)
AsyncOp = Callable[[int, int], Awaitable[object]]


@dataclass(frozen=True)
class Budget:
    """A cell stops after the round in which it has `min_ops` operations and either
    `min_seconds` of timed rounds or `max_bytes` moved; or once `max_seconds` pass."""

    min_ops: int = 100
    min_seconds: float = 1.0
    max_bytes: int = 1_000_000_000
    max_seconds: float = 4.0

    def done(self, ops: int, moved_bytes: int, seconds: float) -> bool:
        if seconds >= self.max_seconds:
            return True
        return ops >= self.min_ops and (seconds >= self.min_seconds or moved_bytes >= self.max_bytes)


@dataclass
class Measurement:
    item_bytes: int
    latencies_s: list[float] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the timed rounds

    @property
    def ops(self) -> int:
        return len(self.latencies_s)

    @property
    def moved_bytes(self) -> int:
        return self.ops * self.item_bytes

    @property
    def gbps(self) -> float:
        return self.moved_bytes / self.seconds / 1e9 if self.seconds else 0.0

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1e3) if self.latencies_s else float("nan")

    def add_round(self, seconds: float, latencies_by_worker: Iterable[list[float]]) -> None:
        """A measured (not warm-up) round: its wall time and every operation's latency."""
        self.seconds += seconds
        self.latencies_s += [latency for latencies in latencies_by_worker for latency in latencies]

    def as_dict(self) -> dict[str, float | int]:
        return {
            "ops": self.ops,
            "bytes": self.moved_bytes,
            "seconds": round(self.seconds, 4),
            "gbps": round(self.gbps, 4),
            "p50_ms": round(self.percentile_ms(50), 4),
            "p99_ms": round(self.percentile_ms(99), 4),
        }


def _shares(count: int, concurrency: int) -> list[range]:
    """Item indices of each worker in one round (a static split: every item once)."""
    return [range(worker, count, concurrency) for worker in range(concurrency)]


def run_threads(
    op: SyncOp,
    *,
    item_bytes: int,
    count: int,
    concurrency: int,
    budget: Budget,
    between_rounds: Callable[[], object] | None = None,
) -> Measurement:
    """Blocking operations; one thread per worker (inline when concurrency is 1)."""
    result = Measurement(item_bytes)

    def worker(index: int, items: range) -> list[float]:
        latencies = []
        for item in items:
            start = time.perf_counter()
            op(index, item)
            latencies.append(time.perf_counter() - start)
        return latencies

    with ThreadPoolExecutor(concurrency) as pool:
        warm = True
        while warm or not budget.done(result.ops, result.moved_bytes, result.seconds):
            start = time.perf_counter()
            if concurrency == 1:
                rounds = [worker(0, range(count))]
            else:
                futures = [
                    pool.submit(worker, w, items) for w, items in enumerate(_shares(count, concurrency))
                ]
                rounds = [f.result() for f in futures]
            if not warm:
                result.add_round(time.perf_counter() - start, rounds)
            warm = False
            if between_rounds is not None:
                between_rounds()
    return result


async def run_tasks(
    op: AsyncOp,
    *,
    item_bytes: int,
    count: int,
    concurrency: int,
    budget: Budget,
    between_rounds: Callable[[], Awaitable[object]] | None = None,
) -> Measurement:
    """Coroutines on the running loop; one task per worker."""
    result = Measurement(item_bytes)

    async def worker(index: int, items: range) -> list[float]:
        latencies = []
        for item in items:
            start = time.perf_counter()
            await op(index, item)
            latencies.append(time.perf_counter() - start)
        return latencies

    warm = True
    while warm or not budget.done(result.ops, result.moved_bytes, result.seconds):
        start = time.perf_counter()
        rounds = await asyncio.gather(
            *(worker(w, items) for w, items in enumerate(_shares(count, concurrency)))
        )
        if not warm:
            result.add_round(time.perf_counter() - start, rounds)
        warm = False
        if between_rounds is not None:
            await between_rounds()
    return result
