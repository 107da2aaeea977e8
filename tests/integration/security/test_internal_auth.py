"""A daemon process with internal auth: calls without a token, or with a wrong one, are
UNAUTHENTICATED; the worker token reads and writes (shared memory included) but the admin
calls are PERMISSION_DENIED; the admin token does both; health stays open. Settings that
cannot be secure stop the start with a message."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from secure_stack import LAYOUT, NAMESPACE, credentials, internal_auth, make_chunks, server_tls, start_daemon

from attnstore.healthcheck import main as healthcheck
from attnstore.kvstore_client import HintAction, KVStoreClient
from kvstore_daemon.launcher import DaemonProcess


@pytest.fixture(scope="module")
def daemon(daemon_factory, pki) -> DaemonProcess:
    return daemon_factory({"tls": server_tls(pki, mutual=False), "internal_auth": internal_auth()})


def client(daemon: DaemonProcess, pki, token: Path | None, *, use_shm: bool = True) -> KVStoreClient:
    creds = credentials(pki, cert=False, token=token)
    return KVStoreClient(daemon.address, use_shm=use_shm, credentials=creds)


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as error:
        call()
    return error.value.code()


def test_callers_without_a_valid_token_are_unauthenticated(daemon: DaemonProcess, pki, tokens) -> None:
    for token in (None, tokens.wrong):
        with client(daemon, pki, token) as anonymous:
            with pytest.raises(grpc.RpcError) as error:
                anonymous.register_namespace(NAMESPACE, **LAYOUT)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "token" in error.value.details()
            assert code_of(anonymous.stats) == grpc.StatusCode.UNAUTHENTICATED
    with KVStoreClient(daemon.address, use_shm=False) as plaintext:
        assert code_of(lambda: plaintext.lookup(NAMESPACE, [bytes(32)])) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("use_shm", [True, False], ids=["shm", "grpc"])
def test_the_worker_token_moves_chunks_but_makes_no_admin_calls(
    daemon: DaemonProcess, pki, tokens, use_shm: bool
) -> None:
    stored = make_chunks(2, seed=int(use_shm))
    with client(daemon, pki, tokens.worker, use_shm=use_shm) as worker:
        assert worker.open_shm() is use_shm  # the arena's location is an internal call too
        worker.register_namespace(NAMESPACE, **LAYOUT)
        assert len(worker.put_chunks(NAMESPACE, stored).stored) == 2  # every call shape carries the token
        assert worker.get_whole_chunks(NAMESPACE, list(stored)) == list(stored.values())
        assert worker.delete(NAMESPACE, list(stored)[1:]) == 1  # workers replace stale chunks
        with pytest.raises(grpc.RpcError) as error:
            worker.stats()
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "admin" in error.value.details()
        assert code_of(lambda: worker.pin(NAMESPACE, [bytes(32)])) == grpc.StatusCode.PERMISSION_DENIED
        hint = [([bytes(32)], HintAction.EVICT_FIRST, 0)]
        assert code_of(lambda: worker.hint(NAMESPACE, hint)) == grpc.StatusCode.PERMISSION_DENIED


def test_the_admin_token_makes_every_call(daemon: DaemonProcess, pki, tokens) -> None:
    with client(daemon, pki, tokens.admin) as admin:
        admin.register_namespace(NAMESPACE, **LAYOUT)
        assert admin.stats().dram.capacity_bytes > 0
        assert admin.unpin(NAMESPACE, [bytes(32)]) == 0
        assert admin.hint(NAMESPACE, [([bytes(32)], HintAction.PREFETCH, 0)]) is not None


def test_health_needs_no_token(daemon: DaemonProcess, pki) -> None:
    assert healthcheck(["--address", daemon.address, "--tls", "--ca-file", str(pki.ca)]) == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"internal_auth": {"enabled": True, "token_sha256": ["ab" * 32]}}, "internal_auth needs tls"),
        (
            {"tls": {"cert_file": "/nonexistent/tls.crt", "key_file": "/nonexistent/tls.key"}},
            "tls.key_file: cannot read",
        ),
        ({"tls": {"cert_file": "/c", "key_file": "/k", "require_client_cert": True}}, "needs client_ca_file"),
    ],
)
def test_settings_that_cannot_be_secure_stop_the_start(tmp_path: Path, settings: dict, message: str) -> None:
    with pytest.raises(RuntimeError, match="exited with 2") as error:
        start_daemon(tmp_path, settings)
    assert message in str(error.value)
