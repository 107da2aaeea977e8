"""The worker's process runs OpenMP with passive waiting (and, when its settings ask, spinning
or bound threads): its entry point sets it before torch is first imported (libgomp reads it
only then), unless the environment says otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pydantic
import pytest

from inference_worker.openmp_waiting import (
    BIND_VARIABLE,
    PIN_SETTING,
    PLACES_VARIABLE,
    SPIN_COUNT_SETTING,
    SPIN_COUNT_VARIABLE,
    WAIT_POLICY_VARIABLE,
)
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
    if name
    not in (
        WAIT_POLICY_VARIABLE,
        SPIN_COUNT_VARIABLE,
        SPIN_COUNT_SETTING,
        PIN_SETTING,
        BIND_VARIABLE,
        PLACES_VARIABLE,
    )
}


def _stdout_of(program: str, environment: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", program],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return done.stdout.strip()


def _wait_policy_when_torch_loads(
    module: str, environment: dict[str, str], variable: str = WAIT_POLICY_VARIABLE
) -> str:
    return _stdout_of(PROBE.format(variable=variable, module=module), environment)


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


PINNED = {**UNSET, PIN_SETTING: "true"}
# In a process set up as the worker's entry point sets itself up (pinning asked for): the
# affinity of the loading thread, of a thread started after it (the engine's step thread,
# after its first parallel region) and of the OpenMP threads that region started.
AFFINITIES = """
import json, os, threading
import inference_worker.main
from inference_worker import openmp_waiting
import torch
openmp_waiting.release_loading_thread()
def cores(tid):
    return sorted(os.sched_getaffinity(tid))
before = set(os.listdir("/proc/self/task"))
seen = {}
def step():
    x = torch.randn(256, 256)
    for _ in range(3):
        x = (x @ x).tanh()
    seen["step"], seen["tid"] = cores(0), str(threading.get_native_id())
thread = threading.Thread(target=step)
thread.start()
thread.join()
team = [cores(int(tid)) for tid in set(os.listdir("/proc/self/task")) - before - {seen["tid"]}]
print(json.dumps({"main": cores(0), "step": seen["step"], "team": team, "threads": torch.get_num_threads()}))
"""


def test_the_pin_setting_reaches_libgomp_in_the_worker_only() -> None:
    assert _wait_policy_when_torch_loads("inference_worker.main", PINNED, BIND_VARIABLE) == "close"
    assert _wait_policy_when_torch_loads("inference_worker.main", PINNED, PLACES_VARIABLE) == "cores"
    assert _wait_policy_when_torch_loads("inference_worker.main", UNSET, BIND_VARIABLE) == "None"
    assert _wait_policy_when_torch_loads("inference_worker.model_store", PINNED, BIND_VARIABLE) == "None"
    explicit = {**PINNED, BIND_VARIABLE: "spread"}
    assert _wait_policy_when_torch_loads("inference_worker.main", explicit, BIND_VARIABLE) == "spread"


def test_the_settings_read_the_pin_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerSettings().openmp_pin_threads is False
    monkeypatch.setenv(PIN_SETTING, "true")
    assert WorkerSettings().openmp_pin_threads is True
    monkeypatch.setenv(PIN_SETTING, "maybe")
    with pytest.raises(pydantic.ValidationError):
        WorkerSettings()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding one thread per core needs two cores")
def test_pinned_the_engine_team_holds_one_core_each_and_the_rest_float() -> None:
    seen = json.loads(_stdout_of(AFFINITIES, PINNED).splitlines()[-1])
    usable = sorted(os.sched_getaffinity(0))
    assert seen["main"] == usable  # the loading thread, and what it starts later, on every core
    bound = [seen["step"], *(team for team in seen["team"] if len(team) == 1)]
    assert len(bound) == seen["threads"] == min(len(usable), seen["threads"])
    assert all(len(cores) == 1 for cores in bound)
    assert len({cores[0] for cores in bound}) == len(bound)  # one core each
