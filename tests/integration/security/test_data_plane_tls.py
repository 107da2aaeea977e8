"""The data plane under the daemon's security: TLS whenever the gRPC server has it, the
internal token checked in the hello, mutual TLS accepted as the credential. A reader on
"another node" (no shared memory) gets byte-identical chunks over it."""

from __future__ import annotations

import socket
import ssl

import grpc
import pytest
from secure_stack import LAYOUT, NAMESPACE, WORKER_TOKEN, credentials, internal_auth, make_chunks, server_tls
from service_probes import free_port

from attnstore.data_plane_wire import pack_frame, recv_frame
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client import KVStoreClient
from kvstore_daemon.launcher import DaemonProcess


def _context(pki, *, cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert:
        context.load_cert_chain(pki.client_cert, pki.client_key)
    return context


@pytest.fixture(scope="module")
def token_daemon(daemon_factory, pki) -> DaemonProcess:
    """TLS and internal tokens (no client certificates)."""
    return daemon_factory(
        {
            "tls": server_tls(pki, mutual=False),
            "internal_auth": internal_auth(),
            "data_plane_port": free_port(),
        }
    )


def test_a_reader_with_the_token_reads_over_tls(token_daemon: DaemonProcess, pki, tokens) -> None:
    stored = make_chunks(4, seed=11)
    with KVStoreClient(
        token_daemon.address,
        use_shm=False,
        credentials=credentials(pki, cert=False, token=tokens.worker),
        data_plane_tls=_context(pki, cert=False),
    ) as client:
        client.register_namespace(NAMESPACE, **LAYOUT)
        assert len(client.put_chunks(NAMESPACE, stored).stored) == 4
        assert client.get_whole_chunks(NAMESPACE, list(stored)) == list(stored.values())
        assert client.client_stats().transport == "dataplane"


def test_the_hello_needs_a_valid_token(token_daemon: DaemonProcess, pki, tokens) -> None:
    port = _data_plane_port(token_daemon, pki, cert=False)
    for token in (None, "guessed-token"):
        with _context(pki, cert=False).wrap_socket(
            socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="localhost"
        ) as sock:
            sock.sendall(pack_frame({"op": "hello", "token": token}))
            reply = recv_frame(sock, 1 << 16)
            assert reply["ok"] is False and reply["code"] == "Unauthenticated"


def test_plaintext_never_reaches_a_tls_data_plane(token_daemon: DaemonProcess, pki, tokens) -> None:
    port = _data_plane_port(token_daemon, pki, cert=False)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(pack_frame({"op": "hello", "token": None}))
        try:
            answer = sock.recv(1 << 16)
        except ConnectionResetError:
            answer = b""
        assert not answer.startswith(pack_frame({"ok": True}))  # a TLS alert, a reset, or closed


def test_mutual_tls_is_a_credential_of_its_own(daemon_factory, pki) -> None:
    daemon = daemon_factory({"tls": server_tls(pki, mutual=True), "data_plane_port": free_port()})
    stored = make_chunks(2, seed=12)
    with KVStoreClient(
        daemon.address,
        use_shm=False,
        credentials=credentials(pki, cert=True),
        data_plane_tls=_context(pki, cert=True),
    ) as client:
        client.register_namespace(NAMESPACE, **LAYOUT)
        client.put_chunks(NAMESPACE, stored)
        assert client.get_whole_chunks(NAMESPACE, list(stored)) == list(stored.values())
        assert client.client_stats().transport == "dataplane"
    # Without a client certificate the data plane's handshake fails, as gRPC's does.
    port = _data_plane_port(daemon, pki, cert=True)
    with (
        pytest.raises((ssl.SSLError, ConnectionResetError)),
        _context(pki, cert=False).wrap_socket(
            socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="localhost"
        ) as sock,
    ):
        sock.sendall(pack_frame({"op": "hello", "token": None}))
        recv_frame(sock, 1 << 16)


def _data_plane_port(daemon: DaemonProcess, pki, *, cert: bool) -> int:
    """The data-plane port, asked over gRPC with the worker token (or the certificate)."""
    key, chain = (pki.client_key.read_bytes(), pki.client_cert.read_bytes()) if cert else (None, None)
    channel_credentials = grpc.ssl_channel_credentials(pki.ca.read_bytes(), key, chain)
    with grpc.secure_channel(daemon.address, channel_credentials) as channel:
        reply = kvstore_pb2_grpc.KVStoreStub(channel).OpenDataPlane(
            kvstore_pb2.OpenDataPlaneRequest(), metadata=[("authorization", f"Bearer {WORKER_TOKEN}")]
        )
    assert reply.tls
    return reply.port
