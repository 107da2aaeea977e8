"""Topology from Kubernetes: watches the daemon pods and the worker pods (label
selectors) with the kubernetes client and maps them to nodes by `spec.nodeName`.

A pod counts once it is Running, Ready and has an IP; its gRPC port is its container port
named "grpc", else the configured one. A node appears when it has a ready worker; its
daemon is the ready daemon pod on the same node (the DaemonSet puts one on every node).
The watch runs in a thread (the client is synchronous) and hands each new topology to
the event loop; it re-lists after the watch ends or fails.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import structlog
from kubernetes import client, config, watch
from kubernetes.client import V1Pod

from attnstore_scheduler.settings import NodeSpec

log = structlog.get_logger("attnstore_scheduler.kubernetes")

_WATCH_TIMEOUT_SECONDS = 300  # the server ends each watch after this; the loop starts another
_RETRY_SECONDS = 5.0


def pod_address(pod: V1Pod, default_port: int) -> str | None:
    """host:port of a ready pod's gRPC server; None while the pod cannot serve."""
    status = pod.status
    if status is None or status.phase != "Running" or not status.pod_ip or pod.metadata.deletion_timestamp:
        return None
    if not any(c.type == "Ready" and c.status == "True" for c in status.conditions or ()):
        return None
    port = default_port
    for container in pod.spec.containers:
        for container_port in container.ports or ():
            if container_port.name == "grpc":
                port = container_port.container_port
    host = f"[{status.pod_ip}]" if ":" in status.pod_ip else status.pod_ip
    return f"{host}:{port}"


def topology_from_pods(
    daemon_pods: Iterable[V1Pod], worker_pods: Iterable[V1Pod], *, daemon_port: int, worker_port: int
) -> list[NodeSpec]:
    """Nodes with at least one ready worker, sorted by name, each with its daemon if ready."""
    daemons: dict[str, str] = {}
    for pod in daemon_pods:
        address = pod_address(pod, daemon_port)
        if address is not None and pod.spec.node_name:
            daemons[pod.spec.node_name] = address
    workers: dict[str, list[str]] = {}
    for pod in worker_pods:
        address = pod_address(pod, worker_port)
        if address is not None and pod.spec.node_name:
            workers.setdefault(pod.spec.node_name, []).append(address)
    return [
        NodeSpec(name=node, daemon_address=daemons.get(node), worker_addresses=tuple(sorted(addresses)))
        for node, addresses in sorted(workers.items())
    ]


@dataclass
class _PodSet:
    selector: str
    pods: dict[str, V1Pod]  # by uid


class PodWatcher:
    """Keeps `on_topology(nodes)` (called on the event loop) up to date with the pods."""

    def __init__(
        self,
        namespace: str,
        daemon_selector: str,
        worker_selector: str,
        *,
        daemon_port: int,
        worker_port: int,
        on_topology: Callable[[Sequence[NodeSpec]], None],
    ) -> None:
        self._namespace = namespace
        self._daemons = _PodSet(daemon_selector, {})
        self._workers = _PodSet(worker_selector, {})
        self._daemon_port = daemon_port
        self._worker_port = worker_port
        self._on_topology = on_topology
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # the two watch threads share the pod maps
        self._last: list[NodeSpec] | None = None

    async def run(self) -> None:
        """Watches until cancelled."""
        try:
            await asyncio.to_thread(config.load_incluster_config)
        except config.ConfigException:
            await asyncio.to_thread(config.load_kube_config)  # outside a cluster: ~/.kube/config
        api = client.CoreV1Api()
        loop = asyncio.get_running_loop()
        try:
            await asyncio.gather(
                asyncio.to_thread(self._watch_forever, api, self._daemons, loop),
                asyncio.to_thread(self._watch_forever, api, self._workers, loop),
            )
        finally:
            self._stopping.set()  # the threads see it within one watch timeout

    def _watch_forever(
        self, api: client.CoreV1Api, pod_set: _PodSet, loop: asyncio.AbstractEventLoop
    ) -> None:
        while not self._stopping.is_set():
            try:
                listed = api.list_namespaced_pod(self._namespace, label_selector=pod_set.selector)
                with self._lock:
                    pod_set.pods = {pod.metadata.uid: pod for pod in listed.items}
                self._publish(loop)
                stream = watch.Watch().stream(
                    api.list_namespaced_pod,
                    self._namespace,
                    label_selector=pod_set.selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=_WATCH_TIMEOUT_SECONDS,
                )
                for event in stream:
                    pod: V1Pod = event["object"]
                    with self._lock:
                        if event["type"] == "DELETED":
                            pod_set.pods.pop(pod.metadata.uid, None)
                        else:
                            pod_set.pods[pod.metadata.uid] = pod
                    self._publish(loop)
                    if self._stopping.is_set():
                        return
            except Exception as exc:  # noqa: BLE001 -- the API server may fail; list again later
                log.warning("pod_watch_failed", selector=pod_set.selector, error=repr(exc))
                self._stopping.wait(_RETRY_SECONDS)

    def _publish(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            nodes = topology_from_pods(
                self._daemons.pods.values(),
                self._workers.pods.values(),
                daemon_port=self._daemon_port,
                worker_port=self._worker_port,
            )
            if nodes == self._last:
                return
            self._last = nodes
        loop.call_soon_threadsafe(self._on_topology, nodes)
