"""Scheduler settings: validated at start, with messages naming the variable."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from attnstore.settings import SettingsError, load_settings
from attnstore_scheduler.settings import SchedulerSettings

NODES = [{"name": "node-a", "daemon_address": "127.0.0.1:50051", "worker_addresses": ["127.0.0.1:50061"]}]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("ATTNSTORE_SCHEDULER_")]:
        monkeypatch.delenv(name)


def test_static_nodes_come_as_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATTNSTORE_SCHEDULER_NODES", json.dumps(NODES))
    monkeypatch.setenv("ATTNSTORE_SCHEDULER_API_KEYS_FILE", str(tmp_path / "keys.yaml"))
    settings = load_settings(SchedulerSettings)
    assert settings.nodes[0].worker_addresses == ("127.0.0.1:50061",)
    assert settings.redis_url is None and settings.listen_address == "127.0.0.1:50071"


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"NODES": json.dumps(NODES)}, "auth_enabled needs api_keys_file"),
        ({"AUTH_ENABLED": "false"}, "exactly one topology source"),
        (
            {"AUTH_ENABLED": "false", "NODES": json.dumps(NODES), "KUBERNETES_DISCOVERY": "true"},
            "exactly one",
        ),
        ({"AUTH_ENABLED": "false", "NODES": json.dumps(NODES * 2)}, "node names must be unique"),
        ({"AUTH_ENABLED": "false", "NODES": json.dumps([{**NODES[0], "worker_addresses": []}])}, "NODES"),
        ({"AUTH_ENABLED": "false", "NODES": json.dumps(NODES), "MAX_QUEUE_LENGTH": "0"}, "MAX_QUEUE_LENGTH"),
        (
            {
                "AUTH_ENABLED": "false",
                "NODES": json.dumps(NODES),
                "SESSION_TTL_SECONDS": "100",
                "MAX_SESSION_TTL_SECONDS": "10",
            },
            "must not exceed max_session_ttl_seconds",
        ),
    ],
)
def test_bad_settings_stop_the_start_with_a_reason(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], message: str
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(f"ATTNSTORE_SCHEDULER_{name}", value)
    with pytest.raises(SettingsError, match=message):
        load_settings(SchedulerSettings)
