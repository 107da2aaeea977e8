"""A daemon process serving mutual TLS: clients with a certificate from its CA get through,
over shared memory and over gRPC; without one, with another CA's, in plaintext, or
trusting the wrong CA, they never reach it. Health probes work over TLS, and on the
plaintext health port without any credential (which serves nothing else)."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from secure_stack import LAYOUT, NAMESPACE, credentials, make_chunks, server_tls

from attnstore.healthcheck import main as healthcheck
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client import KVStoreClient
from attnstore.security import ClientCredentials
from attnstore.server.ports import free_port
from kvstore_daemon.launcher import DaemonProcess


@pytest.fixture(scope="module")
def health_address() -> str:
    """Chosen as the daemon starts, not when the module is collected: a port picked at
    collection was free 25 minutes before this module ran, and another test's server
    (gRPC binds with SO_REUSEPORT) could share it by then."""
    return f"127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def daemon(daemon_factory, pki, health_address: str) -> DaemonProcess:
    return daemon_factory({"tls": server_tls(pki, mutual=True) | {"health_listen_address": health_address}})


@pytest.mark.parametrize("use_shm", [True, False], ids=["shm", "grpc"])
def test_a_client_with_a_certificate_of_the_ca_gets_through(
    daemon: DaemonProcess, pki, use_shm: bool
) -> None:
    stored = make_chunks(3, seed=int(use_shm))
    with KVStoreClient(daemon.address, use_shm=use_shm, credentials=credentials(pki, cert=True)) as client:
        assert client.open_shm() is use_shm  # control over TLS, bytes through /dev/shm
        client.register_namespace(NAMESPACE, **LAYOUT)
        assert len(client.put_chunks(NAMESPACE, stored).stored) == 3
        assert client.lookup(NAMESPACE, list(stored)).prefix_length == 3
        assert client.get_whole_chunks(NAMESPACE, list(stored)) == list(stored.values())


@pytest.mark.parametrize(
    "client_credentials",
    [
        pytest.param(lambda pki: credentials(pki, cert=False), id="no client certificate"),
        pytest.param(
            lambda pki: ClientCredentials.from_pem(
                pki.ca.read_bytes(),
                certificate_chain=pki.rogue_cert.read_bytes(),
                private_key=pki.rogue_key.read_bytes(),
            ),
            id="a certificate of another CA",
        ),
        pytest.param(lambda pki: None, id="plaintext"),
        pytest.param(
            lambda pki: credentials(pki, cert=True, ca_file=pki.rogue_ca), id="the server not trusted"
        ),
        pytest.param(
            lambda pki: credentials(pki, cert=True, server_name="elsewhere.example"), id="another server name"
        ),
    ],
)
def test_callers_that_fail_the_handshake_never_reach_it(
    daemon: DaemonProcess, pki, client_credentials
) -> None:
    client = KVStoreClient(daemon.address, use_shm=False, credentials=client_credentials(pki))
    with client, pytest.raises(grpc.RpcError) as error:
        client.lookup(NAMESPACE, [bytes(32)])
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_server_name_from_the_certificate_overrides_the_dialed_host(daemon: DaemonProcess, pki) -> None:
    creds = credentials(pki, cert=True, server_name="attnstore.internal")
    with KVStoreClient(daemon.address, use_shm=False, credentials=creds) as client:
        assert client.stats().dram.capacity_bytes > 0


def test_the_health_probe_speaks_mutual_tls(daemon: DaemonProcess, pki) -> None:
    tls = ["--address", daemon.address, "--tls", "--ca-file", str(pki.ca)]
    assert healthcheck([*tls, "--cert-file", str(pki.client_cert), "--key-file", str(pki.client_key)]) == 0
    assert healthcheck(tls) == 1


def test_the_plaintext_health_port_answers_a_caller_without_a_certificate_and_nothing_else(
    daemon: DaemonProcess, health_address: str
) -> None:
    """What Kubernetes' gRPC probes need under mutual TLS: they present no certificate."""
    with grpc.insecure_channel(health_address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        service = health_pb2.HealthCheckRequest(service="attnstore.kvstore.v1.KVStore")
        assert health_pb2_grpc.HealthStub(channel).Check(service, timeout=5).status == reply.status
        with pytest.raises(grpc.RpcError) as error:
            kvstore_pb2_grpc.KVStoreStub(channel).Stats(kvstore_pb2.StatsRequest(), timeout=5)
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert healthcheck(["--address", health_address]) == 0
    assert healthcheck(["--address", daemon.address]) == 1  # the TLS port still needs the handshake
