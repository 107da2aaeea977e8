"""A daemon process serving mutual TLS: clients with a certificate from its CA get through,
over shared memory and over gRPC; without one, with another CA's, in plaintext, or
trusting the wrong CA, they never reach it. Health probes work over TLS."""

from __future__ import annotations

import grpc
import pytest
from secure_stack import LAYOUT, NAMESPACE, credentials, make_chunks, server_tls

from attnstore.healthcheck import main as healthcheck
from attnstore.kvstore_client import KVStoreClient
from attnstore.security import ClientCredentials
from kvstore_daemon.launcher import DaemonProcess


@pytest.fixture(scope="module")
def daemon(daemon_factory, pki) -> DaemonProcess:
    return daemon_factory({"tls": server_tls(pki, mutual=True)})


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
