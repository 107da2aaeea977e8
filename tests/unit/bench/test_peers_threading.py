"""bench-peers' and turn_split's worker threading flags: one parser, and only what was asked
for reaches the worker's settings (the rest stays the worker's defaults)."""

from __future__ import annotations

import argparse

from bench.peers.attnstore_stack import add_worker_threading_args, worker_threading
from bench.peers.run import parse_args


def test_the_flags_reach_the_worker_settings_only_when_given() -> None:
    parser = argparse.ArgumentParser()
    add_worker_threading_args(parser)
    default = parser.parse_args([])
    assert worker_threading(default.worker_openmp_spin_count, default.worker_openmp_pin_threads) == {}
    given = parser.parse_args(["--worker-openmp-spin-count", "300000", "--worker-openmp-pin-threads"])
    assert worker_threading(given.worker_openmp_spin_count, given.worker_openmp_pin_threads) == {
        "openmp_spin_count": 300000,
        "openmp_pin_threads": True,
    }
    assert worker_threading(None, True) == {"openmp_pin_threads": True}


def test_bench_peers_takes_the_same_flags() -> None:
    args = parse_args(["--worker-openmp-pin-threads"])
    assert (args.worker_openmp_spin_count, args.worker_openmp_pin_threads) == (None, True)
