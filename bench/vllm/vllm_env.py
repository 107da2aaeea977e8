"""vLLM CPU with attnstore-vllm importable: the one place that installs it, for the
connector's tests (tests/integrations/vllm) and `make bench-vllm`.

vLLM gets its own cached venv from bench's peer installer (`ensure_peer("vllm")`; its
pins clash with ours). The attnstore packages are not installed into it: they are put on
PYTHONPATH from this checkout (so the venv never points into one worktree), and only the
SDK's third-party dependencies are pip-installed there, once per change of them (a stamp
beside the venv)."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

from bench.peers.install import PeerVenv, ensure_peer

ROOT = Path(__file__).resolve().parents[2]
DEPS_STAMP = "attnstore-vllm-deps.json"
INSTALL_TIMEOUT_SECONDS = 900


class VllmUnavailable(RuntimeError):
    """vLLM CPU could not be installed; the message says why."""


def ensure_vllm() -> PeerVenv:
    """vLLM CPU's venv, with the third-party dependencies of the attnstore SDK."""
    peer = ensure_peer("vllm")
    if peer.python is None:
        raise VllmUnavailable(peer.reason)
    deps = tomllib.loads((ROOT / "services" / "pyproject.toml").read_text())["project"]["dependencies"]
    stamp = peer.python.parent.parent / DEPS_STAMP
    if not stamp.exists() or json.loads(stamp.read_text()) != deps:
        command = [str(peer.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *deps]
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS
        )
        if done.returncode != 0:
            raise VllmUnavailable(f"`{' '.join(command)}` failed:\n{done.stderr[-3000:]}")
        stamp.write_text(json.dumps(deps))
    return peer


def connector_env(peer: PeerVenv) -> dict[str, str]:
    """The environment of a vLLM process that loads AttnStoreConnector from this checkout."""
    paths = [str(ROOT / "services"), str(ROOT / "integrations" / "vllm")]
    return {**peer.env(), "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1"}
