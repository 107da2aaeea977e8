"""Runs Python code in a fresh interpreter with a chosen hash seed: keys and digests must
not depend on the process that computes them (Python salts str hashes per process)."""

import subprocess
import sys


def output_of(script: str, *, hash_seed: int) -> str:
    """The stripped stdout of `python -c script` run with PYTHONHASHSEED=hash_seed."""
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": str(hash_seed)},
    ).stdout.strip()
