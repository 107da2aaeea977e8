"""Pods to topology: real kubernetes-client V1Pod objects, no cluster."""

from __future__ import annotations

import datetime

from kubernetes.client import (
    V1Container,
    V1ContainerPort,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodSpec,
    V1PodStatus,
)

from attnstore_scheduler.kubernetes_discovery import pod_address, topology_from_pods
from attnstore_scheduler.settings import NodeSpec


def pod(
    name: str,
    node: str | None,
    ip: str | None,
    *,
    phase: str = "Running",
    ready: bool = True,
    grpc_port: int | None = None,
    deleting: bool = False,
) -> V1Pod:
    ports = [V1ContainerPort(container_port=9102, name="metrics")]
    if grpc_port is not None:
        ports.append(V1ContainerPort(container_port=grpc_port, name="grpc"))
    return V1Pod(
        metadata=V1ObjectMeta(
            name=name,
            uid=f"uid-{name}",
            deletion_timestamp=datetime.datetime.now(datetime.UTC) if deleting else None,
        ),
        spec=V1PodSpec(node_name=node, containers=[V1Container(name="main", ports=ports)]),
        status=V1PodStatus(
            phase=phase,
            pod_ip=ip,
            conditions=[V1PodCondition(type="Ready", status="True" if ready else "False")],
        ),
    )


def test_only_running_ready_pods_with_an_ip_have_an_address() -> None:
    assert pod_address(pod("a", "n1", "10.0.0.5"), 50061) == "10.0.0.5:50061"
    assert pod_address(pod("a", "n1", "10.0.0.5", grpc_port=7000), 50061) == "10.0.0.5:7000"
    assert pod_address(pod("a", "n1", "fd00::5"), 50061) == "[fd00::5]:50061"
    for not_serving in (
        pod("a", "n1", "10.0.0.5", phase="Pending"),
        pod("a", "n1", "10.0.0.5", ready=False),
        pod("a", "n1", None),
        pod("a", "n1", "10.0.0.5", deleting=True),
    ):
        assert pod_address(not_serving, 50061) is None


def test_workers_are_grouped_by_node_with_that_nodes_daemon() -> None:
    daemons = [
        pod("daemon-1", "node-1", "10.0.1.2", grpc_port=50051),
        pod("daemon-2", "node-2", "10.0.2.2", ready=False),  # not ready: node-2 has no cache yet
        pod("daemon-3", "node-3", "10.0.3.2"),  # a node without workers is not routed to
    ]
    workers = [
        pod("worker-b", "node-1", "10.0.1.11"),
        pod("worker-a", "node-1", "10.0.1.10"),
        pod("worker-c", "node-2", "10.0.2.10"),
        pod("worker-d", "node-2", "10.0.2.11", phase="Failed"),
        pod("worker-e", None, "10.0.9.9"),  # not scheduled yet
    ]

    nodes = topology_from_pods(daemons, workers, daemon_port=50051, worker_port=50061)

    assert nodes == [
        NodeSpec(
            name="node-1",
            daemon_address="10.0.1.2:50051",
            worker_addresses=("10.0.1.10:50061", "10.0.1.11:50061"),
        ),
        NodeSpec(name="node-2", daemon_address=None, worker_addresses=("10.0.2.10:50061",)),
    ]
