"""The worker's process runs OpenMP with passive waiting: its entry point sets it before
torch is first imported (libgomp reads it only then), unless the environment says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

from inference_worker.openmp_waiting import WAIT_POLICY_VARIABLE

# Prints the variable at the moment importing {module} first imports torch, then
# stops there (nothing heavy loads).
PROBE = """
import os, sys
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print(os.environ.get({variable!r}))
            raise SystemExit(0)
        return None
sys.meta_path.insert(0, Spy())
import {module}
"""


UNSET = {name: value for name, value in os.environ.items() if name != WAIT_POLICY_VARIABLE}


def _wait_policy_when_torch_loads(module: str, environment: dict[str, str]) -> str:
    program = PROBE.format(variable=WAIT_POLICY_VARIABLE, module=module)
    done = subprocess.run(
        [sys.executable, "-c", program],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout.strip()


def test_the_worker_sets_passive_waiting_before_torch_loads() -> None:
    assert _wait_policy_when_torch_loads("inference_worker.main", UNSET) == "PASSIVE"


def test_an_explicit_wait_policy_wins() -> None:
    explicit = {**os.environ, WAIT_POLICY_VARIABLE: "ACTIVE"}
    assert _wait_policy_when_torch_loads("inference_worker.main", explicit) == "ACTIVE"


def test_importing_the_package_leaves_other_processes_alone() -> None:
    assert _wait_policy_when_torch_loads("inference_worker.model_store", UNSET) == "None"
