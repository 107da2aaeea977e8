"""TLS and internal-auth settings: nested in each service's settings (JSON or one variable
per field), validated at start with messages naming the setting, files read by load()."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from attnstore.security import (
    ChannelSecurity,
    InternalAuth,
    SecurityConfigError,
    ServerTLS,
    check_server_security,
    token_digest,
)
from attnstore.settings import SettingsError, load_settings
from attnstore_scheduler.settings import SchedulerSettings
from inference_worker.settings import WorkerSettings
from kvstore_daemon.settings import DaemonSettings

DIGEST = token_digest("s3cret")
TLS_ON = ServerTLS(cert_file=Path("/tls/tls.crt"), key_file=Path("/tls/tls.key"))


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("ATTNSTORE_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cert_file": "/c.pem"}, "cert_file and key_file go together"),
        ({"cert_file": "/c", "key_file": "/k", "require_client_cert": True}, "needs client_ca_file"),
        ({"cert_file": "/c", "key_file": "/k", "client_ca_file": "/ca"}, "only with require_client_cert"),
        ({"client_ca_file": "/ca", "require_client_cert": True}, "mutual TLS is TLS"),
        ({"health_listen_address": "0.0.0.0:50052"}, "health_listen_address is for TLS servers"),
        ({"cert_file": "/c", "key_file": "/k", "ca_file": "/ca"}, "Extra inputs"),
    ],
)
def test_server_tls_refuses_inconsistent_fields(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerTLS(**fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ca_file": "/ca"}, "ca_file need tls=true"),
        ({"token_file": "/t"}, "token_file need tls=true"),
        ({"tls": True, "cert_file": "/c"}, "cert_file and key_file go together"),
    ],
)
def test_channel_security_refuses_inconsistent_fields(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ChannelSecurity(**fields)


def test_internal_auth_needs_tls_and_a_credential() -> None:
    with pytest.raises(ValidationError, match="should match pattern"):
        InternalAuth(enabled=True, token_sha256=("s3cret",))
    with pytest.raises(ValidationError, match="should match pattern"):  # `$` anchors at the very end
        InternalAuth(enabled=True, token_sha256=(DIGEST + "\n",))
    with pytest.raises(ValidationError, match="enabled is false"):
        InternalAuth(token_sha256=(DIGEST,))
    with pytest.raises(ValueError, match="internal_auth needs tls"):
        check_server_security(ServerTLS(), InternalAuth(enabled=True, token_sha256=(DIGEST,)))
    with pytest.raises(ValueError, match="needs a credential to check"):
        check_server_security(TLS_ON, InternalAuth(enabled=True))
    check_server_security(TLS_ON, InternalAuth(enabled=True, admin_token_sha256=(DIGEST.upper(),)))
    assert InternalAuth(enabled=True, token_sha256=(DIGEST.upper(),)).token_sha256 == (DIGEST,)


def test_nested_settings_come_per_field_or_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSTORE_DAEMON_TLS__CERT_FILE", "/tls/tls.crt")
    monkeypatch.setenv("ATTNSTORE_DAEMON_TLS__KEY_FILE", "/tls/tls.key")
    auth = {"enabled": True, "token_sha256": [DIGEST]}
    monkeypatch.setenv("ATTNSTORE_DAEMON_INTERNAL_AUTH", json.dumps(auth))
    settings = load_settings(DaemonSettings)
    assert settings.tls == TLS_ON
    assert settings.internal_auth.enabled and settings.internal_auth.token_sha256 == (DIGEST,)
    assert load_settings(WorkerSettings).kvstore_channel == ChannelSecurity()  # off by default

    monkeypatch.setenv("ATTNSTORE_SCHEDULER_AUTH_ENABLED", "false")
    monkeypatch.setenv("ATTNSTORE_SCHEDULER_KUBERNETES_DISCOVERY", "true")
    monkeypatch.setenv("ATTNSTORE_SCHEDULER_DAEMON_CHANNEL", json.dumps({"tls": True, "server_name": "kv"}))
    assert load_settings(SchedulerSettings).daemon_channel.server_name == "kv"


def test_errors_name_the_nested_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSTORE_WORKER_KVSTORE_CHANNEL__TLS", "maybe")
    monkeypatch.setenv("ATTNSTORE_WORKER_INTERNAL_AUTH__ENABLED", "true")
    monkeypatch.setenv("ATTNSTORE_WORKER_INTERNAL_AUTH__TOKEN_SHA256", json.dumps([DIGEST]))
    with pytest.raises(SettingsError) as error:
        load_settings(WorkerSettings)
    assert "ATTNSTORE_WORKER_KVSTORE_CHANNEL__TLS" in str(error.value)
    monkeypatch.delenv("ATTNSTORE_WORKER_KVSTORE_CHANNEL__TLS")
    with pytest.raises(SettingsError, match="internal_auth needs tls"):
        load_settings(WorkerSettings)


def test_load_reads_the_files_and_names_a_missing_one(tmp_path: Path) -> None:
    assert ServerTLS().load() is None and ChannelSecurity().load("kvstore_channel") is None
    with pytest.raises(SecurityConfigError, match=r"tls.key_file: cannot read .*absent.key: No such file"):
        ServerTLS(cert_file=tmp_path / "absent.crt", key_file=tmp_path / "absent.key").load()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SecurityConfigError, match=r"kvstore_channel.token_file: .*empty is empty"):
        ChannelSecurity(tls=True, token_file=tmp_path / "empty").load("kvstore_channel")
    (tmp_path / "token").write_text("s3cret\n")
    credentials = ChannelSecurity(tls=True, token_file=tmp_path / "token", server_name="kv").load("c")
    assert credentials is not None and credentials.token == "s3cret" and credentials.server_name == "kv"
    assert "s3cret" not in repr(credentials)


def test_load_refuses_a_pair_grpc_cannot_use(tmp_path: Path) -> None:
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_text(f"-----BEGIN CERTIFICATE-----\nnot {name}\n-----END CERTIFICATE-----\n")
    with pytest.raises(SecurityConfigError, match="grpc refused tls.cert_file or tls.key_file"):
        ServerTLS(cert_file=tmp_path / "tls.crt", key_file=tmp_path / "tls.key").load()


@pytest.mark.parametrize("peers", [{"peers": ["127.0.0.1:1"]}, {"pool_redis_url": "redis://127.0.0.1:1"}],
                         ids=["listed", "from-the-ledger"])  # fmt: skip
def test_a_secure_worker_calls_its_long_context_peers_with_tls(peers: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="long_context.peer_channel.tls"):
        WorkerSettings(tls=TLS_ON, long_context=peers)
    WorkerSettings(tls=TLS_ON, long_context={**peers, "peer_channel": {"tls": True}})
    WorkerSettings(long_context=peers)  # plaintext worker, plaintext peers
