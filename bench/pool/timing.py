"""Closed-loop timing: `concurrency` workers each keep one operation in flight for a
fixed time; a warm-up operation per worker is not recorded. Throughput is the bytes the
timed operations moved over the window's wall time; latencies are per operation."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

SyncOp = Callable[[int, int], None]  # (worker, operation number)
AsyncOp = Callable[[int, int], Awaitable[None]]


@dataclass(frozen=True)
class Cell:
    ops: int
    seconds: float
    item_bytes: int
    p50_ms: float
    p99_ms: float

    @property
    def gbps(self) -> float:
        return self.ops * self.item_bytes / self.seconds / 1e9 if self.seconds else 0.0


def _cell(latencies: list[float], seconds: float, item_bytes: int) -> Cell:
    values = np.array(latencies or [float("nan")])
    return Cell(
        len(latencies),
        seconds,
        item_bytes,
        float(np.percentile(values, 50) * 1e3),
        float(np.percentile(values, 99) * 1e3),
    )


def run_threads(op: SyncOp, concurrency: int, seconds: float, item_bytes: int) -> Cell:
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(concurrency + 1)
    deadline = [0.0]

    def worker(w: int) -> None:
        op(w, -1)  # warm-up
        start.wait()
        mine, n = [], 0
        while time.perf_counter() < deadline[0]:
            t0 = time.perf_counter()
            op(w, n)
            mine.append(time.perf_counter() - t0)
            n += 1
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + 3600  # set for real once every worker is warm
    start.wait()
    began = time.perf_counter()
    deadline[0] = began + seconds
    for thread in threads:
        thread.join()
    return _cell(latencies, time.perf_counter() - began, item_bytes)


async def run_tasks(
    op: AsyncOp, concurrency: int, seconds: float, item_bytes: int, prepare: AsyncOp | None = None
) -> Cell:
    """`prepare(worker, n)` runs before each operation, untimed but inside the window (a
    Delete before a Put of the same chunk)."""
    for w in range(concurrency):  # warm-up
        if prepare is not None:
            await prepare(w, -1)
    await asyncio.gather(*(op(w, -1) for w in range(concurrency)))
    latencies: list[float] = []
    began = time.perf_counter()
    deadline = began + seconds

    async def worker(w: int) -> None:
        n = 0
        while time.perf_counter() < deadline:
            if prepare is not None:
                await prepare(w, n)
            t0 = time.perf_counter()
            await op(w, n)
            latencies.append(time.perf_counter() - t0)
            n += 1

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return _cell(latencies, time.perf_counter() - began, item_bytes)
