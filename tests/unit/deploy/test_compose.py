"""Static checks of docker-compose.yml and the Dockerfiles it builds (no Docker engine needed):
what the files name must exist in the repository and agree with the services' settings."""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest
import yaml

from kvstore_daemon.settings import DaemonSettings

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "docker-compose.yml"
DAEMON_SERVICE = "kvstore-daemon"
DAEMON_ENV_PREFIX = "ATTNSTORE_DAEMON_"
# Read by FileBackedSettings itself, not a field of the model.
DAEMON_ENV_EXTRA = {"ATTNSTORE_DAEMON_CONFIG_FILE"}
_SIZE_UNITS = {"b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


@dataclass
class Dockerfile:
    """The parts of a Dockerfile these checks read (final stage wins for ENTRYPOINT)."""

    entrypoint: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    exposed_ports: set[int] = field(default_factory=set)
    installed_dirs: list[Path] = field(default_factory=list)  # local projects given to pip, in the context
    pip_args: list[str] = field(default_factory=list)


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with comments dropped and continuation lines joined."""
    joined: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined]


def parse_dockerfile(path: Path, context: Path) -> Dockerfile:
    parsed = Dockerfile()
    workdir = PurePosixPath("/")
    copied: dict[PurePosixPath, Path] = {}  # container path -> context path
    for instruction, args in _instructions(path):
        if instruction == "FROM":
            workdir = PurePosixPath("/")
        elif instruction == "WORKDIR":
            workdir = workdir / args
        elif instruction == "COPY" and not args.startswith("--from"):
            *sources, dest = shlex.split(args)
            for source in sources:
                copied[workdir / dest] = context / source
        elif instruction == "ENV":
            for word in shlex.split(args):
                key, _, value = word.partition("=")
                parsed.env[key] = value
        elif instruction == "EXPOSE":
            parsed.exposed_ports |= {int(port.split("/")[0]) for port in args.split()}
        elif instruction == "ENTRYPOINT":
            parsed.entrypoint = json.loads(args)
        elif instruction == "HEALTHCHECK":
            parsed.healthcheck = json.loads(args.split("CMD", 1)[1])
        elif instruction == "RUN" and re.search(r"\bpip install\b", args):
            words = shlex.split(args.split("pip install", 1)[1])
            parsed.pip_args += words
            for word in words:
                if word.startswith(("./", "/")):
                    assert workdir / word in copied, f"{path}: pip installs {word}, which no COPY provides"
                    parsed.installed_dirs.append(copied[workdir / word])
    return parsed


def project(directory: Path) -> dict:
    return tomllib.loads((directory / "pyproject.toml").read_text())["project"]


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def local_projects() -> dict[str, Path]:
    """Distribution name -> directory, for every project in the repository."""
    found = {}
    for pyproject in REPO.glob("*/pyproject.toml"):
        found[requirement_name(project(pyproject.parent)["name"])] = pyproject.parent
    return found


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {key: str(value) for key, value in env.items()}


def size_bytes(value: str | int) -> int:
    match = re.fullmatch(r"(\d+)\s*([a-z]*)", str(value).strip().lower())
    assert match, f"unreadable size {value!r}"
    return int(match[1]) * _SIZE_UNITS[match[2] or "b"]


def use_daemon_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Replaces every ATTNSTORE_DAEMON_* variable of this process with those in `env`."""
    for key in os.environ:
        if key.startswith(DAEMON_ENV_PREFIX):
            monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith(DAEMON_ENV_PREFIX):
            monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def built(compose: dict) -> dict[str, tuple[Path, Dockerfile]]:
    """Service name -> (build context, parsed Dockerfile) for every service compose builds."""
    result = {}
    for name, service in compose["services"].items():
        if "build" in service:
            build = service["build"]
            build = build if isinstance(build, dict) else {"context": build}
            context = (REPO / build.get("context", ".")).resolve()
            result[name] = (
                context,
                parse_dockerfile(context / build.get("dockerfile", "Dockerfile"), context),
            )
    return result


def test_compose_has_redis_and_the_daemon(compose: dict) -> None:
    assert {"redis", DAEMON_SERVICE} <= set(compose["services"])


def test_every_service_has_a_healthcheck(compose: dict) -> None:
    for name, service in compose["services"].items():
        check = service.get("healthcheck")
        assert check and not check.get("disable") and check.get("test"), f"{name} has no healthcheck"


def test_build_contexts_and_dockerfiles_exist(compose: dict) -> None:
    for name, service in compose["services"].items():
        if "build" not in service:
            continue
        build = service["build"] if isinstance(service["build"], dict) else {"context": service["build"]}
        context = REPO / build.get("context", ".")
        assert context.is_dir(), f"{name}: build context {context} missing"
        assert (context / build.get("dockerfile", "Dockerfile")).is_file(), f"{name}: Dockerfile missing"


def test_copied_sources_exist_and_are_installed(built: dict) -> None:
    for name, (_, dockerfile) in built.items():
        assert dockerfile.installed_dirs, f"{name}: the Dockerfile pip-installs no local project"
        for directory in dockerfile.installed_dirs:
            assert (directory / "pyproject.toml").is_file(), f"{name}: {directory} is not a project"
        assert "--no-cache-dir" in dockerfile.pip_args


def test_commands_the_image_runs_are_declared_console_scripts(compose: dict, built: dict) -> None:
    for name, (_, dockerfile) in built.items():
        scripts = {}
        for directory in dockerfile.installed_dirs:
            scripts |= project(directory).get("scripts", {})
        assert dockerfile.entrypoint, f"{name}: no ENTRYPOINT"
        commands = [dockerfile.entrypoint[0]]
        if dockerfile.healthcheck:
            commands.append(dockerfile.healthcheck[0])
        test = compose["services"][name]["healthcheck"]["test"]
        if isinstance(test, list) and test[0] == "CMD":
            commands.append(test[1])
        for command in commands:
            assert command in scripts, (
                f"{name}: {command} is not a console script of {dockerfile.installed_dirs}"
            )


def test_named_volumes_are_declared(compose: dict) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.get("source") if isinstance(volume, dict) else volume.split(":")[0]
            if isinstance(volume, dict) and volume.get("type", "volume") != "volume":
                continue
            if source and not source.startswith((".", "/", "~")):
                assert source in declared, f"{name}: volume {source} is not declared"


def test_daemon_environment_is_valid_settings(
    compose: dict, built: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = built[DAEMON_SERVICE][1].env | environment(compose["services"][DAEMON_SERVICE])
    daemon_env = {key: value for key, value in env.items() if key.startswith(DAEMON_ENV_PREFIX)}
    for key in daemon_env.keys() - DAEMON_ENV_EXTRA:
        assert key.removeprefix(DAEMON_ENV_PREFIX).lower() in DaemonSettings.model_fields, key
    # The values must validate too, exactly as the daemon would read them.
    use_daemon_env(monkeypatch, daemon_env)
    settings = DaemonSettings()
    port = int(settings.listen_address.rsplit(":", 1)[1])
    assert {port, settings.metrics_port} <= built[DAEMON_SERVICE][1].exposed_ports


def test_daemon_shm_holds_the_arena(compose: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    service = compose["services"][DAEMON_SERVICE]
    use_daemon_env(monkeypatch, environment(service))
    assert size_bytes(service["shm_size"]) > DaemonSettings().dram_capacity_bytes


def test_published_ports_are_exposed(compose: dict, built: dict) -> None:
    for name, (_, dockerfile) in built.items():
        for mapping in compose["services"][name].get("ports", []):
            container_port = int(str(mapping).split(":")[-1].split("/")[0])
            assert container_port in dockerfile.exposed_ports, f"{name}: {container_port} not exposed"


def test_daemon_image_does_not_install_torch(built: dict) -> None:
    dockerfile = built[DAEMON_SERVICE][1]
    projects = local_projects()
    pending = [requirement_name(project(d)["name"]) for d in dockerfile.installed_dirs]
    pending += [requirement_name(arg) for arg in dockerfile.pip_args if not arg.startswith(("-", ".", "/"))]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in projects:
            pending += [requirement_name(r) for r in project(projects[name]).get("dependencies", [])]
    assert not {name for name in seen if name == "torch" or name.startswith("torch")}, seen


def test_dockerignore_drops_local_state() -> None:
    patterns = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "bench/results"} <= patterns
