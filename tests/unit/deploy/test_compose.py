"""docker-compose.yml (and its GPU override) as Docker Compose loads them, without an
engine: valid against the compose-spec, and what they name exists in the repository and
agrees with the services' settings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from deploy_support import (
    COMPOSE_FILE,
    COMPOSE_GPU_FILE,
    DOCKERFILE,
    IMAGE_TARGETS,
    REPO,
    Dockerfile,
    check_settings_env,
    compose_config,
)

SERVICES = {  # compose service -> (project directory, settings env prefix)
    "kvstore-daemon": ("kvstore-daemon", "ATTNSTORE_DAEMON_"),
    "inference-worker": ("inference-worker", "ATTNSTORE_WORKER_"),
    "scheduler": ("scheduler", "ATTNSTORE_SCHEDULER_"),
}
HEALTHY = {"condition": "service_healthy", "required": True}
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def image_dockerfile(service: dict, dockerfiles: dict[str, Dockerfile]) -> Dockerfile:
    return next(image for image in dockerfiles.values() if image.target == service["build"]["target"])


def effective_env(service: dict, dockerfiles: dict[str, Dockerfile]) -> dict[str, str]:
    """The container's environment: the image's ENV, overridden by compose's."""
    return image_dockerfile(service, dockerfiles).final.env | {
        key: str(value) for key, value in (service.get("environment") or {}).items()
    }


def settings_of(name: str, compose: dict, dockerfiles, settings_classes):
    return check_settings_env(
        settings_classes[SERVICES[name][0]], effective_env(compose["services"][name], dockerfiles)
    )


def mounts(service: dict) -> dict[str, dict]:
    """Container path -> volume entry."""
    return {volume["target"]: volume for volume in service.get("volumes", [])}


def tmpfs_size_bytes(options: str) -> int:
    match = re.search(r"(?:^|,)size=(\d+)([kmg]?)(?:,|$)", options.lower())
    assert match, f"no size in tmpfs options {options!r}"
    return int(match[1]) * _SIZE_UNITS[match[2]]


@pytest.mark.parametrize("files", [[COMPOSE_FILE], [COMPOSE_FILE, COMPOSE_GPU_FILE]], ids=["cpu", "gpu"])
def test_compose_validates_against_the_compose_spec(files: list[Path]) -> None:
    result = compose_config(*files)
    assert result.returncode == 0, result.stderr
    assert not result.stderr.strip(), result.stderr  # no warnings either


def test_compose_rejects_what_the_spec_forbids(tmp_path: Path) -> None:
    """The validator is real: a misspelled key and a dangling depends_on both fail."""
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  a:\n    image: x\n    helthcheck: {}\n")
    assert compose_config(bad).returncode != 0
    bad.write_text("services:\n  a:\n    image: x\n    depends_on: {b: {condition: service_healthy}}\n")
    assert compose_config(bad).returncode != 0


def test_stack_is_redis_daemon_scheduler_and_worker(compose: dict) -> None:
    assert set(compose["services"]) == {"redis", *SERVICES}


@pytest.mark.parametrize("name", SERVICES)
def test_services_are_built_from_their_dockerfiles(compose: dict, name: str) -> None:
    build = compose["services"][name]["build"]
    assert Path(build["context"]) == REPO  # the images need services/ beside the project
    assert REPO / build["dockerfile"] == DOCKERFILE  # the one Dockerfile, one target per service
    assert build["target"] == IMAGE_TARGETS[SERVICES[name][0]]


@pytest.mark.parametrize("name", SERVICES)
def test_health_checks_ask_the_services_grpc_health(
    compose: dict, dockerfiles, settings_classes, name: str
) -> None:
    service = compose["services"][name]
    test = service["healthcheck"]["test"]
    assert test[:2] == ["CMD", "attnstore-healthcheck"], test
    port = int(settings_of(name, compose, dockerfiles, settings_classes).listen_address.rsplit(":", 1)[1])
    assert test[test.index("--address") + 1] == f"127.0.0.1:{port}"


def test_redis_has_a_health_check(compose: dict) -> None:
    assert compose["services"]["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_services_start_once_their_dependencies_are_healthy(compose: dict) -> None:
    services = compose["services"]
    assert services["inference-worker"]["depends_on"] == {"kvstore-daemon": HEALTHY}
    assert services["scheduler"]["depends_on"] == {
        "redis": HEALTHY,
        "kvstore-daemon": HEALTHY,
        "inference-worker": HEALTHY,
    }


@pytest.mark.parametrize("name", SERVICES)
def test_environment_is_valid_settings(compose: dict, dockerfiles, settings_classes, name: str) -> None:
    settings_of(name, compose, dockerfiles, settings_classes)


@pytest.mark.parametrize("name", SERVICES)
def test_published_ports_are_the_services_ports(
    compose: dict, dockerfiles, settings_classes, name: str
) -> None:
    service = compose["services"][name]
    settings = settings_of(name, compose, dockerfiles, settings_classes)
    served = {int(settings.listen_address.rsplit(":", 1)[1]), settings.metrics_port}
    if getattr(settings, "openai_listen_address", None):  # the scheduler's HTTP API
        served.add(int(settings.openai_listen_address.rsplit(":", 1)[1]))
    published = {port["target"] for port in service["ports"]}
    assert published == served
    assert published <= image_dockerfile(service, dockerfiles).final.exposed_ports


@pytest.mark.parametrize("name", SERVICES)
def test_stop_grace_covers_the_shutdown_grace(
    compose: dict, dockerfiles, settings_classes, name: str
) -> None:
    settings = settings_of(name, compose, dockerfiles, settings_classes)
    # The worker spends the grace twice: in-flight turns, then pending KV saves.
    needed = settings.shutdown_grace_seconds * (2 if name == "inference-worker" else 1)
    stop_grace = compose["services"][name].get("stop_grace_period", "10s")
    seconds = sum(
        int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([hms])", stop_grace)
    )
    assert seconds > needed, f"{name}: stop_grace_period {stop_grace} <= {needed}s"


def test_daemon_and_worker_share_the_arena_tmpfs(compose: dict, dockerfiles, settings_classes) -> None:
    daemon = settings_of("kvstore-daemon", compose, dockerfiles, settings_classes)
    worker = settings_of("inference-worker", compose, dockerfiles, settings_classes)
    shm_dir = str(daemon.shm_dir)
    daemon_mount = mounts(compose["services"]["kvstore-daemon"])[shm_dir]
    worker_dir = str(worker.kvstore_shm_dir or daemon.shm_dir)
    worker_mount = mounts(compose["services"]["inference-worker"])[worker_dir]
    assert daemon_mount["type"] == worker_mount["type"] == "volume"
    assert daemon_mount["source"] == worker_mount["source"]
    assert worker.kvstore_use_shm
    options = compose["volumes"][daemon_mount["source"]]["driver_opts"]
    assert options["type"] == "tmpfs" and options["device"] == "tmpfs"
    # The daemon reserves the whole arena at start: the tmpfs must hold it.
    assert tmpfs_size_bytes(options["o"]) > daemon.dram_capacity_bytes
    assert "uid=10001" in options["o"] and "gid=10001" in options["o"]


def test_worker_dials_the_daemon_service(compose: dict, dockerfiles, settings_classes) -> None:
    daemon = settings_of("kvstore-daemon", compose, dockerfiles, settings_classes)
    worker = settings_of("inference-worker", compose, dockerfiles, settings_classes)
    assert worker.kvstore_address == f"kvstore-daemon:{daemon.listen_address.rsplit(':', 1)[1]}"


def test_scheduler_knows_the_stack(compose: dict, dockerfiles, settings_classes) -> None:
    scheduler = settings_of("scheduler", compose, dockerfiles, settings_classes)
    daemon = settings_of("kvstore-daemon", compose, dockerfiles, settings_classes)
    worker = settings_of("inference-worker", compose, dockerfiles, settings_classes)
    assert scheduler.redis_url == "redis://redis:6379/0"
    [node] = scheduler.nodes
    assert node.daemon_address == f"kvstore-daemon:{daemon.listen_address.rsplit(':', 1)[1]}"
    assert node.worker_addresses == (f"inference-worker:{worker.listen_address.rsplit(':', 1)[1]}",)


def test_daemon_ssd_dirs_are_on_a_volume(compose: dict, dockerfiles, settings_classes) -> None:
    daemon = settings_of("kvstore-daemon", compose, dockerfiles, settings_classes)
    volumes = mounts(compose["services"]["kvstore-daemon"])
    for ssd_dir in daemon.ssd_dirs:
        assert any(ssd_dir.is_relative_to(target) for target in volumes), f"{ssd_dir} is not on a volume"


def test_gpu_override_builds_cuda_torch_and_reserves_a_gpu(compose: dict, compose_gpu: dict) -> None:
    cpu, gpu = compose["services"]["inference-worker"], compose_gpu["services"]["inference-worker"]
    assert cpu["build"]["args"]["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert gpu["build"]["args"]["TORCH_INDEX_URL"] != cpu["build"]["args"]["TORCH_INDEX_URL"]
    assert gpu["image"] != cpu["image"]  # two variants never overwrite each other's tag
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert gpu["environment"]["ATTNSTORE_WORKER_DEVICE"].startswith("cuda")
    assert cpu["environment"]["ATTNSTORE_WORKER_DEVICE"] == "cpu"
    # Everything else is the base stack's.
    for name in compose["services"]:
        if name != "inference-worker":
            assert json.dumps(compose["services"][name], sort_keys=True) == json.dumps(
                compose_gpu["services"][name], sort_keys=True
            )
