"""Probes of running services shared by test folders (tests/ is on sys.path through the
root conftest): a free loopback port, a service's Prometheus samples, its gRPC health."""

from __future__ import annotations

import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnstore.server.ports import free_port

# free_port is here for the test folders to import with the other probes.
__all__ = ["free_port", "is_serving", "scrape_metrics"]


def scrape_metrics(port: int) -> dict[str, float]:
    """Every sample of the /metrics page by its name with labels, e.g.
    `attnstore_kvstore_hits_total{tier="dram"}`."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples}


def is_serving(address: str, timeout_seconds: float = 5.0) -> bool:
    """Whether the server's overall grpc.health.v1 status is SERVING."""
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=timeout_seconds
        )
    return reply.status == health_pb2.HealthCheckResponse.SERVING
