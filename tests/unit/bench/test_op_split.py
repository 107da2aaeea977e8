"""bench.peers.op_split: per op, the calling thread's CPU and the other threads' meanwhile."""

from __future__ import annotations

import threading
import time
import types

from bench.peers.op_split import OpSplit


def _burn(seconds: float) -> None:
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


class Helper:
    """A thread that burns CPU when asked and lives on after it (as an OpenMP team's threads
    do: a thread that ends takes its CPU out of /proc/self/task)."""

    def __init__(self) -> None:
        self.asked, self.done, self.leave = threading.Event(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        self.asked.wait()
        _burn(0.05)
        self.done.set()
        self.leave.wait()

    def helped(self) -> None:
        """The helper burns 50 ms of CPU while this thread waits for it."""
        self.asked.set()
        self.done.wait()


def test_an_op_bills_the_master_its_own_cpu_and_the_others_theirs() -> None:
    helper = Helper()
    ops = types.SimpleNamespace(alone=_burn, helped=helper.helped)
    split = OpSplit()
    try:
        with split.installed({"alone": (ops, "alone"), "helped": (ops, "helped")}):
            ops.alone(0.05)
            ops.alone(0.05)
            ops.helped()
    finally:
        helper.leave.set()
        helper.thread.join()
    alone, helped = split.totals["alone"], split.totals["helped"]
    assert alone.calls == 2 and helped.calls == 1
    assert alone.read_ns > 0  # the reads of the others' clocks, counted apart from the op
    assert alone.master_ns >= 90e6 and alone.other_ns < 20e6  # 2 x 50 ms on the master alone
    assert helped.other_ns >= 45e6 and helped.master_ns < 20e6  # the helper's 50 ms, not the master's
    assert ops.alone is _burn and ops.helped == helper.helped  # put back when the block ends


def test_calls_from_other_threads_are_not_counted() -> None:
    ops = types.SimpleNamespace(alone=_burn)
    split = OpSplit()
    with split.installed({"alone": (ops, "alone")}):
        elsewhere = threading.Thread(target=ops.alone, args=(0.01,))
        elsewhere.start()
        elsewhere.join()
    assert "alone" not in split.totals
