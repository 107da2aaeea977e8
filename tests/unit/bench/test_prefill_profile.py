"""bench.peers.prefill_profile's FLOP count and shape argument (the forward it times runs in
the paged-engine tests; the profile itself is a diagnosis run by hand)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bench.peers.prefill_profile import Shape, prefill_flops
from inference_worker.model_geometry import ModelGeometry

# SmolLM2-135M's shape
GEOMETRY = ModelGeometry(
    num_layers=30, heads=9, kv_heads=3, head_dim=64, max_positions=8192, vocab_size=49152
)


def test_flops_count_linears_per_new_token_the_head_once_and_causal_attention() -> None:
    layer_weights, head_weights = 1000, 50
    fresh = prefill_flops(GEOMETRY, layer_weights, head_weights, Shape(0, 4))
    # 4 tokens see 1 + 2 + 3 + 4 keys
    assert fresh == 2 * 4 * 1000 + 2 * 50 + 4 * 30 * 9 * 64 * 10
    later = prefill_flops(GEOMETRY, layer_weights, head_weights, Shape(100, 4))
    assert later - fresh == 4 * 30 * 9 * 64 * 4 * 100  # each new token also sees the 100 cached


def test_shape_parses_prefix_x_new_and_refuses_nonsense() -> None:
    assert Shape.parse("1250x480") == Shape(1250, 480)
    for text in ("800x0", "-1x5"):
        with pytest.raises(argparse.ArgumentTypeError, match="PREFIXxNEW"):
            Shape.parse(text)


def test_importing_it_leaves_openmp_waiting_alone() -> None:
    """Only `main` sets OMP_WAIT_POLICY (before it loads torch): importing the module, as
    this test does, changes nothing for the processes a test session starts."""
    probe = "import os, sys, bench.peers.prefill_profile as p; print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},  # no OMP_WAIT_POLICY of the test session's
        cwd=Path(__file__).resolve().parents[3],  # the repository root: `bench` importable
        timeout=120,
    )
    assert done.stdout.split() == ["None", "False"]
