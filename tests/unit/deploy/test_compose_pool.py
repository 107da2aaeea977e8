"""docker-compose.pool.yml (two "nodes" in one KV pool) and docker-compose.pool-tls.yml (TLS
on every hop, the pool's included) as Docker Compose merges them over docker-compose.yml,
without an engine: valid against the compose-spec, every service's environment valid
settings, each node's worker beside its own daemon, the daemons in the scheduler's ledger
under the names and addresses the scheduler routes by, and the workers listed there as
lenders to each other's long turns."""

from __future__ import annotations

from pathlib import Path

import pytest
from deploy_support import COMPOSE_FILE, REPO, check_settings_env, compose_config, load_compose
from test_compose import effective_env, mounts, tmpfs_size_bytes

POOL_FILE = REPO / "docker-compose.pool.yml"
POOL_TLS_FILE = REPO / "docker-compose.pool-tls.yml"
NODES = {
    "node-a": ("kvstore-daemon", "inference-worker"),
    "node-b": ("kvstore-daemon-b", "inference-worker-b"),
}
PROJECTS = {  # compose service -> project directory
    "kvstore-daemon": "kvstore-daemon", "kvstore-daemon-b": "kvstore-daemon",
    "inference-worker": "inference-worker", "inference-worker-b": "inference-worker", "scheduler": "scheduler",
}  # fmt: skip
STACKS = {"pool": [COMPOSE_FILE, POOL_FILE], "pool-tls": [COMPOSE_FILE, POOL_FILE, POOL_TLS_FILE]}
TLS_DIR = Path("/etc/attnstore/tls")


@pytest.fixture(scope="module", params=STACKS)
def stack(request: pytest.FixtureRequest) -> tuple[str, dict]:
    return request.param, load_compose(*STACKS[request.param])


def settings(stack: tuple[str, dict], service: str, dockerfiles, settings_classes):
    compose = stack[1]
    return check_settings_env(
        settings_classes[PROJECTS[service]], effective_env(compose["services"][service], dockerfiles)
    )


@pytest.mark.parametrize("name", STACKS)
def test_the_pool_stacks_validate_against_the_compose_spec(name: str) -> None:
    result = compose_config(*STACKS[name])
    assert result.returncode == 0, result.stderr
    assert not result.stderr.strip(), result.stderr


def test_every_service_has_valid_settings(stack, dockerfiles, settings_classes) -> None:
    assert set(stack[1]["services"]) == {"redis", *PROJECTS}
    for service in PROJECTS:
        settings(stack, service, dockerfiles, settings_classes)


def test_each_node_has_its_own_tiers_and_its_worker_shares_its_arena(
    stack, dockerfiles, settings_classes
) -> None:
    compose = stack[1]
    sources = []
    for daemon_name, worker_name in NODES.values():
        daemon = settings(stack, daemon_name, dockerfiles, settings_classes)
        worker = settings(stack, worker_name, dockerfiles, settings_classes)
        assert worker.kvstore_address == f"{daemon_name}:{daemon.listen_address.rsplit(':', 1)[1]}"
        arena = mounts(compose["services"][daemon_name])[str(daemon.shm_dir)]
        assert (
            mounts(compose["services"][worker_name])[str(worker.kvstore_shm_dir)]["source"] == arena["source"]
        )
        options = compose["volumes"][arena["source"]]["driver_opts"]
        assert options["type"] == "tmpfs" and tmpfs_size_bytes(options["o"]) > daemon.dram_capacity_bytes
        ssd = mounts(compose["services"][daemon_name])
        sources += [arena["source"], *(ssd[str(d)]["source"] for d in daemon.ssd_dirs)]
    assert len(sources) == len(set(sources))  # no volume shared between the nodes


def test_the_daemons_join_the_schedulers_ledger_as_the_nodes_it_routes_to(
    stack, dockerfiles, settings_classes
) -> None:
    scheduler = settings(stack, "scheduler", dockerfiles, settings_classes)
    nodes = {node.name: node for node in scheduler.nodes}
    assert set(nodes) == set(NODES)
    for name, (daemon_name, worker_name) in NODES.items():
        daemon = settings(stack, daemon_name, dockerfiles, settings_classes)
        worker = settings(stack, worker_name, dockerfiles, settings_classes)
        assert daemon.pool_redis_url == scheduler.redis_url  # the ledger is in the scheduler's Redis
        assert daemon.pool_node == name and daemon.pool_advertise_address == nodes[name].daemon_address
        assert daemon.data_plane_port and daemon.pool_capacity_bytes > 0
        assert nodes[name].worker_addresses == (f"{worker_name}:{worker.listen_address.rsplit(':', 1)[1]}",)
    assert scheduler.pool_routing_min_share is not None


def test_the_workers_lend_to_each_others_long_turns_through_the_ledger(
    stack, dockerfiles, settings_classes
) -> None:
    """Each node's worker lists itself in the daemons' ledger on its node, under the address
    the scheduler (and so the other worker) reaches it by; with TLS it calls its peers so."""
    scheduler = settings(stack, "scheduler", dockerfiles, settings_classes)
    nodes = {node.name: node for node in scheduler.nodes}
    for name, (daemon_name, worker_name) in NODES.items():
        daemon = settings(stack, daemon_name, dockerfiles, settings_classes)
        long = settings(stack, worker_name, dockerfiles, settings_classes).long_context
        assert long.pool_redis_url == daemon.pool_redis_url and long.pool_node == daemon.pool_node == name
        assert (long.advertise_address,) == nodes[name].worker_addresses
        assert long.peer_channel.tls is (stack[0] == "pool-tls")
        if long.peer_channel.tls:
            assert long.peer_channel.server_name == "attnstore.internal"
            assert long.peer_channel.cert_file == TLS_DIR / "tls.crt"


def test_no_two_services_publish_the_same_host_port(stack) -> None:
    published = [p["published"] for s in stack[1]["services"].values() for p in s.get("ports", [])]
    assert len(published) == len(set(published))


def test_tls_on_every_hop_the_pools_included(dockerfiles, settings_classes) -> None:
    stack = ("pool-tls", load_compose(*STACKS["pool-tls"]))
    compose = stack[1]
    channels = {"kvstore-daemon": ["pool_channel"], "inference-worker": ["kvstore_channel"],
                "scheduler": ["daemon_channel", "worker_channel"]}  # fmt: skip
    for service, project in PROJECTS.items():
        loaded = settings(stack, service, dockerfiles, settings_classes)
        assert loaded.tls.cert_file == TLS_DIR / "tls.crt"
        assert mounts(compose["services"][service])[str(TLS_DIR)]["read_only"]
        for name in channels[project]:
            channel = getattr(loaded, name)
            assert channel.tls and channel.ca_file == TLS_DIR / "ca.crt"
            assert channel.server_name == "attnstore.internal"
            assert channel.cert_file == TLS_DIR / "tls.crt"  # mutual TLS: the daemons and workers require it
        if project != "scheduler":
            assert loaded.tls.require_client_cert
        test = compose["services"][service]["healthcheck"]["test"]
        assert "--tls" in test and test[test.index("--ca-file") + 1] == str(TLS_DIR / "ca.crt")
