"""API keys: stored as sha256 digests, read from YAML or JSON, turned into a tenant."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from attnstore.errors import PermissionDenied, Unauthenticated
from attnstore_scheduler.auth import ApiKeys, ApiKeysError, Principal


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def keys() -> ApiKeys:
    return ApiKeys({"acme": [digest("k1"), digest("k2")], "ops": [digest("root")]}, admin_tenant="ops")


@pytest.mark.parametrize(
    "metadata",
    [[("authorization", "Bearer k1")], [("authorization", "bearer  k2 ")], [("x-api-key", "k1")]],
)
def test_a_known_key_names_its_tenant(keys: ApiKeys, metadata: list[tuple[str, str]]) -> None:
    assert keys.authenticate(metadata) == Principal("acme", admin=False)


def test_the_admin_tenants_keys_may_act_for_others(keys: ApiKeys) -> None:
    admin = keys.authenticate([("x-api-key", "root")])
    assert admin.admin and admin.tenant_for("acme") == "acme" and admin.tenant_for("") == "ops"
    with pytest.raises(PermissionDenied):
        keys.authenticate([("x-api-key", "k1")]).tenant_for("ops")


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ([], "no API key"),
        ([("x-api-key", "")], "no API key"),
        ([("authorization", "Token k1")], "Bearer"),
        ([("authorization", "Bearer")], "Bearer"),
        ([("x-api-key", "k3")], "unknown API key"),
        ([("x-api-key", digest("k1"))], "unknown API key"),  # the stored digest is not a key
    ],
)
def test_missing_or_unknown_keys_are_unauthenticated(
    keys: ApiKeys, metadata: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(Unauthenticated, match=message):
        keys.authenticate(metadata)


def test_the_keys_file_may_be_yaml_or_json(tmp_path: Path) -> None:
    (tmp_path / "keys.yaml").write_text(f"acme:\n  - {digest('k1')}\n")
    (tmp_path / "keys.json").write_text(f'{{"acme": ["{digest("k1").upper()}"]}}')
    for name in ("keys.yaml", "keys.json"):
        assert ApiKeys.load(tmp_path / name, "admin").authenticate([("x-api-key", "k1")]).tenant == "acme"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- just a list", "expected a mapping"),
        ("acme: [abc]", "not a sha256 hex digest"),
        (f"acme: ['{'0' * 64}']\nother: ['{'0' * 64}']", "listed for tenants"),
        (f"'bad tenant!': ['{'0' * 64}']", "is not a tenant name"),
        ('"acme\\n": ["' + "0" * 64 + '"]', "is not a tenant name"),
        ('acme: ["' + "0" * 64 + '\\n"]', "not a sha256 hex digest"),
        ("acme: [", "keys.yaml"),
    ],
)
def test_a_malformed_keys_file_is_refused_with_the_reason(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "keys.yaml").write_text(text)
    with pytest.raises(ApiKeysError, match=message):
        ApiKeys.load(tmp_path / "keys.yaml", "admin")
