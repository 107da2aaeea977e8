"""Who runs each op of a forward at two threads: per op, its calls, the CPU the calling
(master) thread spent inside them and the CPU every other thread of the process spent
meanwhile (`prefill_profile --ops`). An op's `master - other` is time the master ran it
alone (Python, dispatch, single-thread work, a region's wake-up and barrier); over a whole
forward, `master - other` is a floor on the time the master ran alone.

Thread CPU, not wall: it is what stays readable on a shared machine. The master's clock is
`time.thread_time_ns`; the others' is `/proc/self/task/*/schedstat` (ns), read outside the
master's window so that the reads (~0.1 ms each under load) are not billed to the op; their
own CPU is counted apart (`read_ns`), so that an enclosing op's time can be had without them. A thread
that ends within an op takes its CPU out of the sum (OpenMP's team lives on between regions).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class OpTotals:
    calls: int = 0
    master_ns: int = 0
    other_ns: int = 0
    read_ns: int = 0  # the master's CPU in this op's own reads of the others' clocks (outside master_ns)


def other_threads_cpu_ns(master: int) -> int:
    """CPU ns of every thread of this process but `master` (a native thread id)."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        if int(task) == master:
            continue
        try:
            with open(f"/proc/self/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
    return total


class OpSplit:
    """Per-op totals of the calls made on the thread that created it, while `installed`."""

    def __init__(self) -> None:
        self.master = threading.get_native_id()
        self.totals: dict[str, OpTotals] = {}

    def timed(self, label: str, op: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(op)
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_native_id() != self.master:  # another thread's call: not the master's
                return op(*args, **kwargs)
            reading = time.thread_time_ns()
            others = other_threads_cpu_ns(self.master)
            started = time.thread_time_ns()
            try:
                return op(*args, **kwargs)
            finally:
                stopped = time.thread_time_ns()
                others = other_threads_cpu_ns(self.master) - others
                totals = self.totals.setdefault(label, OpTotals())
                totals.calls += 1
                totals.master_ns += stopped - started
                totals.other_ns += others
                totals.read_ns += (started - reading) + (time.thread_time_ns() - stopped)

        return call

    @contextmanager
    def installed(self, ops: dict[str, tuple[object, str]]) -> Iterator[OpSplit]:
        """Each op (label: (owner, attribute name)) timed until the block ends."""
        originals = {label: (owner, name, getattr(owner, name)) for label, (owner, name) in ops.items()}
        try:
            for label, (owner, name, original) in originals.items():
                setattr(owner, name, self.timed(label, original))
            yield self
        finally:
            for owner, name, original in originals.values():
                setattr(owner, name, original)
