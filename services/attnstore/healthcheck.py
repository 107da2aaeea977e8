"""Container health probe: asks a service's standard gRPC health endpoint whether it is
SERVING. Exit status 0 when it is, 1 otherwise (NOT_SERVING, unknown service,
unreachable, timeout). Used by the Dockerfile's images and docker-compose.yml in place of
grpc_health_probe, which the images do not ship. A service serving TLS is asked over
TLS (`--tls`, with `--ca-file`, and the client certificate when it requires one); health
needs no internal token.

    attnstore-healthcheck --address 127.0.0.1:50051 [--service NAME] [--timeout-seconds 3]
        [--tls --ca-file CA.pem [--cert-file CERT.pem --key-file KEY.pem] [--server-name NAME]]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnstore.same_named import same_named
from attnstore.security.credentials import ClientCredentials, SecurityConfigError, sync_channel
from attnstore.security.tls import ChannelSecurity
from attnstore.server.ports import DAEMON_PORT


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="attnstore-healthcheck", description="Exit 0 when a gRPC server reports SERVING, 1 otherwise."
    )
    parser.add_argument("--address", default=f"127.0.0.1:{DAEMON_PORT}", help="host:port of the gRPC server")
    parser.add_argument("--service", default="", help="service name to check; empty = the whole server")
    parser.add_argument("--timeout-seconds", type=float, default=3.0, help="deadline of the Check call")
    parser.add_argument("--tls", action="store_true", help="dial with TLS")
    parser.add_argument("--ca-file", type=Path, help="PEM CA bundle of the server's certificate")
    parser.add_argument("--cert-file", type=Path, help="PEM client certificate (mutual TLS)")
    parser.add_argument("--key-file", type=Path, help="PEM private key of --cert-file")
    parser.add_argument("--server-name", help="name in the server's certificate, if not the address's host")
    return parser.parse_args(argv)


def check(
    address: str, service: str, timeout_seconds: float, credentials: ClientCredentials | None = None
) -> str:
    """Returns the reported status name, or a description of why there is none."""
    with sync_channel(address, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_seconds)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        security = same_named(ChannelSecurity, args, token_file=None)  # health needs no token
        credentials = security.load("healthcheck")
    except (ValueError, SecurityConfigError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"attnstore-healthcheck: {exc}", file=sys.stderr)
        return 1
    status = check(args.address, args.service, args.timeout_seconds, credentials)
    serving = status == "SERVING"
    print(f"{args.address} service={args.service!r}: {status}", file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    raise SystemExit(main())
