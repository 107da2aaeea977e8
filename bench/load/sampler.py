"""Memory and CPU time of every service over time: a thread that reads each process
(psutil) once per interval.

Memory comes as two numbers: `rss` (everything resident, shared-memory pages included)
and `private` (rss minus file-backed and shared pages: the heap, where a leak would show).
The daemon's DRAM tier is a fixed-size shared-memory arena (dram_capacity_bytes) whose
pages count in the RSS of the daemon and of the workers that map it as they are first
touched, so RSS grows while the arena fills even though its size is fixed.

Beside the services, each sample also records the CPU time of the whole machine and of
this process (the load client), so a report can tell how much CPU other processes took.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil


@dataclass(frozen=True)
class Sample:
    seconds: float  # since the sampler started
    service: str
    rss_bytes: int
    private_bytes: int
    cpu_seconds: float  # user + system since the process started


@dataclass(frozen=True)
class MachineSample:
    seconds: float
    busy_cpu_seconds: float  # every process on the machine, since boot
    steal_cpu_seconds: float  # time the hypervisor gave this machine's CPUs to others
    client_cpu_seconds: float  # the load client (this process)


@dataclass
class ResourceSampler:
    pids: dict[str, int]  # service name -> pid
    interval_seconds: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    machine: list[MachineSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _started: float = 0.0

    def start(self) -> ResourceSampler:
        processes = {name: psutil.Process(pid) for name, pid in self.pids.items()}
        self._started = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, args=(processes,), name="resource-sampler", daemon=True
        )
        self._thread.start()
        return self

    def now(self) -> float:
        """Seconds since the sampler started (the samples' clock)."""
        return time.monotonic() - self._started

    def _run(self, processes: dict[str, psutil.Process]) -> None:
        client = psutil.Process(os.getpid())
        while not self._stop.is_set():
            at = self.now()
            total, mine = psutil.cpu_times(), client.cpu_times()
            busy = total.user + total.nice + total.system + total.irq + total.softirq
            self.machine.append(MachineSample(at, busy, total.steal, mine.user + mine.system))
            for name, process in processes.items():
                try:
                    with process.oneshot():
                        info, cpu = process.memory_info(), process.cpu_times()
                except psutil.Error:  # it exited: the benchmark reports the failed turns
                    continue
                self.samples.append(Sample(at, name, info.rss, info.rss - info.shared, cpu.user + cpu.system))
            self._stop.wait(self.interval_seconds)

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.samples
