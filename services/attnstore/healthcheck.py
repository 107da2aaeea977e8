"""Container health probe: asks a service's standard gRPC health endpoint whether it is
SERVING. Exit status 0 when it is, 1 otherwise (NOT_SERVING, unknown service,
unreachable, timeout). Used by the Dockerfiles and docker-compose.yml in place of
grpc_health_probe, which the images do not ship.

    attnstore-healthcheck --address 127.0.0.1:50051 [--service NAME] [--timeout-seconds 3]
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="attnstore-healthcheck", description="Exit 0 when a gRPC server reports SERVING, 1 otherwise."
    )
    parser.add_argument("--address", default="127.0.0.1:50051", help="host:port of the gRPC server")
    parser.add_argument("--service", default="", help="service name to check; empty = the whole server")
    parser.add_argument("--timeout-seconds", type=float, default=3.0, help="deadline of the Check call")
    return parser.parse_args(argv)


def check(address: str, service: str, timeout_seconds: float) -> str:
    """Returns the reported status name, or a description of why there is none."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_seconds)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    status = check(args.address, args.service, args.timeout_seconds)
    serving = status == "SERVING"
    print(f"{args.address} service={args.service!r}: {status}", file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    raise SystemExit(main())
