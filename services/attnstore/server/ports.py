"""A free TCP port on loopback, for a service started on a port it must be told in advance
(Redis, uvicorn's listen address, a test's metrics port): bind port 0, read it, let go."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
