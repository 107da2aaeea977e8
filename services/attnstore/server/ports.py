"""The services' default gRPC ports, and a free TCP port on loopback for a service started
on a port it must be told in advance (Redis, uvicorn's listen address, a test's metrics
port): bind port 0, read it, let go."""

from __future__ import annotations

import socket

# Each service's default gRPC port, written once: its settings listen there, the scheduler's
# Kubernetes discovery assumes it of pods that name no port, the CLI and the health check
# call it by default.
DAEMON_PORT, WORKER_PORT, SCHEDULER_PORT = 50051, 50061, 50071


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
