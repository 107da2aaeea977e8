"""Fixtures of the deployment tests: the compose project as Docker Compose itself loads it,
and every service's image in the one Dockerfile, parsed."""

from __future__ import annotations

import pytest
from deploy_support import COMPOSE_FILE, COMPOSE_GPU_FILE, Dockerfile, load_compose, service_images


@pytest.fixture(scope="session")
def compose() -> dict:
    """docker-compose.yml, normalized by Compose (long syntax, absolute build contexts)."""
    return load_compose(COMPOSE_FILE)


@pytest.fixture(scope="session")
def compose_gpu() -> dict:
    """docker-compose.yml with docker-compose.gpu.yml merged over it."""
    return load_compose(COMPOSE_FILE, COMPOSE_GPU_FILE)


@pytest.fixture(scope="session")
def dockerfiles() -> dict[str, Dockerfile]:
    """Project directory name -> its image, a target of the one Dockerfile, parsed."""
    return service_images()


@pytest.fixture(scope="session")
def settings_classes() -> dict[str, type]:
    """Project directory name -> the settings model its service loads at start."""
    from attnstore_scheduler.settings import SchedulerSettings
    from inference_worker.settings import WorkerSettings
    from kvstore_daemon.settings import DaemonSettings

    return {
        "kvstore-daemon": DaemonSettings,
        "inference-worker": WorkerSettings,
        "scheduler": SchedulerSettings,
    }
