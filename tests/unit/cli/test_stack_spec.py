"""The local stack's spec: what each service is given (TLS, internal auth, overrides in
order) and the topologies it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnstore.security import token_digest
from attnstore_cli.stack_spec import InternalAuth, StackSpec, StackTls, WorkerSpec


def _tls(root: Path) -> StackTls:
    return StackTls(*(root / name for name in ("ca", "server.crt", "server.key", "client.crt", "client.key")))


def _auth(root: Path) -> InternalAuth:
    (root / "worker.token").write_text("w-token\n")
    (root / "admin.token").write_text("a-token\n")
    return InternalAuth(root / "worker.token", root / "admin.token")


def test_without_security_the_services_get_only_the_log_level_and_their_settings(tmp_path: Path) -> None:
    spec = StackSpec(
        tmp_path,
        log_level="INFO",
        daemon_settings={"dram_capacity_bytes": 1},
        worker_settings={"chunk_tokens": 16, "device": "cpu"},
        workers=(WorkerSpec("a", settings={"chunk_tokens": 32}),),
        scheduler_settings={"log_level": "DEBUG"},
    )
    assert spec.daemon_service_settings() == {"log_level": "INFO", "dram_capacity_bytes": 1}
    assert spec.worker_service_settings(spec.workers[0]) == {
        "log_level": "INFO",
        "chunk_tokens": 32,
        "device": "cpu",
    }
    assert spec.scheduler_service_settings() == {"log_level": "DEBUG"}  # the service's settings win


def test_tls_and_internal_auth_reach_every_endpoint_and_channel(tmp_path: Path) -> None:
    tls, auth = _tls(tmp_path), _auth(tmp_path)
    spec = StackSpec(tmp_path, tls=tls, internal_auth=auth)
    mutual = {**tls.server(mutual=False), "client_ca_file": tls.ca_file, "require_client_cert": True}
    digests = {
        "enabled": True,
        "token_sha256": [token_digest("w-token")],
        "admin_token_sha256": [token_digest("a-token")],
    }
    assert spec.daemon_service_settings() == {"tls": mutual, "internal_auth": digests}
    worker = spec.worker_service_settings(spec.workers[0])
    assert worker["tls"] == mutual and worker["internal_auth"] == digests
    assert worker["kvstore_channel"] == {**tls.client(), "token_file": auth.worker_token_file}
    scheduler = spec.scheduler_service_settings()
    assert scheduler["tls"] == tls.server(mutual=False)  # the public API takes any TLS client
    assert "internal_auth" not in scheduler
    admin = {**tls.client(), "token_file": auth.admin_token_file}
    assert scheduler["daemon_channel"] == admin and scheduler["worker_channel"] == admin


@pytest.mark.parametrize(
    ("workers", "daemons", "message"),
    [
        ((WorkerSpec("a"), WorkerSpec("a")), 1, "worker names must differ"),
        ((WorkerSpec("a", daemon=1),), 1, "no daemon 1"),
        ((WorkerSpec("a", node="n", daemon=0), WorkerSpec("b", node="n", daemon=1)), 2, "different daemons"),
    ],
)
def test_impossible_topologies_are_refused(
    tmp_path: Path, workers: tuple[WorkerSpec, ...], daemons: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        StackSpec(tmp_path, workers=workers, daemons=daemons)


def test_each_daemon_stands_for_its_workers_node_or_the_node_named_for_it(tmp_path: Path) -> None:
    workers = (WorkerSpec("a1", node="node-a"), WorkerSpec("a2", node="node-a"), WorkerSpec("b", daemon=1))
    spec = StackSpec(tmp_path, daemons=3, workers=workers, daemon_settings={"pool_capacity_bytes": 1})
    assert spec.daemon_service_settings(0) == {"pool_node": "node-a", "pool_capacity_bytes": 1}
    assert spec.daemon_service_settings(1)["pool_node"] == "b"  # a worker's node defaults to its name
    assert "pool_node" not in spec.daemon_service_settings(2)  # no worker: the daemon's own default
    named = StackSpec(tmp_path, daemons=2, workers=(), daemon_nodes=("node-a", "node-b"))
    assert [named.daemon_service_settings(i)["pool_node"] for i in (0, 1)] == ["node-a", "node-b"]
    with pytest.raises(ValueError, match="daemon_nodes names 1 nodes for 2 daemons"):
        StackSpec(tmp_path, daemons=2, workers=(), daemon_nodes=("node-a",))
    with pytest.raises(ValueError, match="worker 'w' is on node 'node-x', its daemon on 'node-a'"):
        StackSpec(tmp_path, workers=(WorkerSpec("w", node="node-x"),), daemon_nodes=("node-a",))
