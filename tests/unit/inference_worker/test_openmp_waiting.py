"""The worker's process runs OpenMP with passive waiting: its entry point sets it before
torch is first imported (libgomp reads it only then), unless the environment says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pydantic
import pytest

from inference_worker.openmp_waiting import SPIN_COUNT_SETTING, SPIN_COUNT_VARIABLE, WAIT_POLICY_VARIABLE
from inference_worker.settings import WorkerSettings

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


UNSET = {
    name: value
    for name, value in os.environ.items()
    if name not in (WAIT_POLICY_VARIABLE, SPIN_COUNT_VARIABLE, SPIN_COUNT_SETTING)
}


def _wait_policy_when_torch_loads(
    module: str, environment: dict[str, str], variable: str = WAIT_POLICY_VARIABLE
) -> str:
    program = PROBE.format(variable=variable, module=module)
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


def test_the_spin_count_setting_reaches_libgomp_in_the_worker_only() -> None:
    spinning = {**UNSET, SPIN_COUNT_SETTING: "30000"}
    assert _wait_policy_when_torch_loads("inference_worker.main", spinning, SPIN_COUNT_VARIABLE) == "30000"
    assert _wait_policy_when_torch_loads("inference_worker.main", UNSET, SPIN_COUNT_VARIABLE) == "None"
    assert (
        _wait_policy_when_torch_loads("inference_worker.model_store", spinning, SPIN_COUNT_VARIABLE) == "None"
    )


def test_the_settings_read_the_same_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SPIN_COUNT_SETTING, "30000")
    assert WorkerSettings().openmp_spin_count == 30000
    monkeypatch.setenv(SPIN_COUNT_SETTING, "-1")
    with pytest.raises(pydantic.ValidationError):
        WorkerSettings()
