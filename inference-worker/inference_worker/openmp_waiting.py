"""OpenMP threads that sleep between parallel regions instead of spinning.

Why: torch's CPU kernels run on libgomp, whose idle threads spin (up to 300,000 polls)
after every parallel region before they sleep. A forward pass runs hundreds of short
regions, so on cores shared with anything else (the daemon and scheduler beside the
worker, the worker's own KV-loading and saving threads, other jobs) a spinning thread
holds a core its partner thread or a neighbour needs. Measured on the 2-core development
machine under other engineers' load (load average 7-13), SmolLM2-135M fp32, 2 threads,
one process per setting taking turns, medians: a decode step of 12 sequences on 600 cached
tokens took 6.1 s wall and 2.2 s CPU by default, 0.41 s and 0.21 s with PASSIVE; a
400-token chunk on 1,000 cached tokens 12.3 s and 5.9 s, against 3.7 s and 1.7 s
(docs/inference-worker.md, "Speed").

libgomp reads the variable once, when torch loads it, so it is set when this module is
imported, and the worker's entry point (main.py) imports it before anything imports torch.
Only the worker's process (and what it starts) is changed, not every process that imports
the package (tests, the benchmark harness and the peers it starts). An explicit setting
wins (`OMP_WAIT_POLICY=ACTIVE` on a node whose cores the worker owns alone).

The worker setting `openmp_spin_count` (`ATTNSTORE_WORKER_OPENMP_SPIN_COUNT`, read here from
the environment since torch has not loaded yet) makes the worker's threads spin that many
polls after each parallel region before they sleep (`GOMP_SPINCOUNT`, which libgomp takes
over any wait policy; it polls ~100,000 times a ms): the gaps between a forward pass's
regions are microseconds, so the threads stay awake through a turn's forward and sleep soon
after it, and only the worker's process spins, not the daemon, the scheduler or a benchmark's
peers beside it. Off by default: at load 10-12 a spin of 30,000 raised a 250-token forward's
CPU by a third (docs/inference-worker.md, fifteenth pass); on idle cores it saves the
~150-230 wake-ups a forward pays. An explicit `GOMP_SPINCOUNT` wins.

The worker setting `openmp_pin_threads` (`ATTNSTORE_WORKER_OPENMP_PIN_THREADS`, read here
likewise) binds the OpenMP threads one per core (`OMP_PROC_BIND=close`, `OMP_PLACES=cores`), as
vLLM's CPU engine binds its own (`VLLM_CPU_OMP_THREADS_BIND`): a team's thread stays on its core
from one parallel region to the next. libgomp binds a thread when it first starts a team (the
engine's step thread to the first core, its team's threads to the next ones) and binds the
thread that loads it at once; `release_loading_thread` gives that one back every usable core,
so the threads it starts later (the event loop's, gRPC's, the KV loaders') are not all held on
the master's core. Off by default: on shared cores a bound thread waits for its core rather
than moving to an idle one. Explicit `OMP_PROC_BIND` / `OMP_PLACES` win.
"""

from __future__ import annotations

import os

WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"
DEFAULT_WAIT_POLICY = "PASSIVE"
SPIN_COUNT_VARIABLE = "GOMP_SPINCOUNT"
SPIN_COUNT_SETTING = "ATTNSTORE_WORKER_OPENMP_SPIN_COUNT"  # WorkerSettings.openmp_spin_count
BIND_VARIABLE, PLACES_VARIABLE = "OMP_PROC_BIND", "OMP_PLACES"
PIN_SETTING = "ATTNSTORE_WORKER_OPENMP_PIN_THREADS"  # WorkerSettings.openmp_pin_threads
# pydantic's true booleans (its false ones off; anything else the settings refuse at start)
TRUE_WORDS = ("1", "true", "t", "yes", "y", "on")
USABLE_CORES = frozenset(os.sched_getaffinity(0))  # before libgomp binds this thread

os.environ.setdefault(WAIT_POLICY_VARIABLE, DEFAULT_WAIT_POLICY)
if os.environ.get(SPIN_COUNT_SETTING, "").isdigit():  # anything else: the settings refuse it at start
    os.environ.setdefault(SPIN_COUNT_VARIABLE, os.environ[SPIN_COUNT_SETTING])
if os.environ.get(PIN_SETTING, "").strip().lower() in TRUE_WORDS:
    os.environ.setdefault(BIND_VARIABLE, "close")
    os.environ.setdefault(PLACES_VARIABLE, "cores")


def release_loading_thread() -> None:
    """Every usable core back to the calling thread, after torch (libgomp) loaded and bound
    it under `OMP_PROC_BIND`: the threads it starts from now on inherit them."""
    os.sched_setaffinity(0, USABLE_CORES)
