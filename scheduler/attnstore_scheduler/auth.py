"""API keys and the tenant a call acts for.

Keys are stored only as sha256 hex digests (`api_keys_file`: a YAML or JSON mapping of
tenant -> list of digests; `printf %s "$KEY" | sha256sum` prints one). A caller sends the
key as `authorization: Bearer <key>` or `x-api-key: <key>`; its digest names the tenant.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from attnstore.errors import InvalidArgument, PermissionDenied, Unauthenticated

# Matched with fullmatch: `$` would also accept a trailing newline ("acme\n", a separate key space).
TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DEV_TENANT = "default"
_DIGEST_PATTERN = re.compile(r"[0-9a-f]{64}")


class ApiKeysError(Exception):
    """The API keys file is unreadable or malformed; the message says where."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant of the key, and whether it may act for other tenants."""

    tenant: str
    admin: bool = False

    def tenant_for(self, requested: str) -> str:
        """The tenant an operation names: the caller's own, or (admins only) another one."""
        if not requested or requested == self.tenant:
            return self.tenant
        if not self.admin:
            raise PermissionDenied("only admin callers may name another tenant")
        return check_tenant_name(requested, "tenant")


def check_tenant_name(tenant: str, where: str) -> str:
    if not TENANT_PATTERN.fullmatch(tenant):
        raise InvalidArgument(
            f"{where} {tenant[:80]!r} is not a tenant name (1-64 of A-Z a-z 0-9 . _ -, starting alphanumeric)"
        )
    return tenant


class ApiKeys:
    """Digest -> tenant; `authenticate` turns call metadata into a Principal."""

    def __init__(self, digests_by_tenant: dict[str, Sequence[str]], admin_tenant: str) -> None:
        self._tenant_of: dict[str, str] = {}
        self._admin_tenant = admin_tenant
        for tenant, digests in digests_by_tenant.items():
            check_tenant_name(tenant, "api keys file: tenant")
            for digest in digests:
                digest = digest.lower()
                if not _DIGEST_PATTERN.fullmatch(digest):
                    raise ApiKeysError(f"tenant {tenant!r}: {digest[:16]!r}... is not a sha256 hex digest")
                if self._tenant_of.setdefault(digest, tenant) != tenant:
                    raise ApiKeysError(
                        f"one key is listed for tenants {self._tenant_of[digest]!r} and {tenant!r}"
                    )

    @classmethod
    def load(cls, path: Path, admin_tenant: str) -> ApiKeys:
        try:
            data = yaml.safe_load(path.read_text())  # JSON is YAML too
        except (OSError, yaml.YAMLError) as exc:
            raise ApiKeysError(f"{path}: {exc}") from exc
        if not isinstance(data, dict) or not all(
            isinstance(tenant, str) and isinstance(digests, list) and all(isinstance(d, str) for d in digests)
            for tenant, digests in data.items()
        ):
            raise ApiKeysError(f"{path}: expected a mapping of tenant name -> list of sha256 hex digests")
        try:
            return cls(data, admin_tenant)
        except InvalidArgument as exc:
            raise ApiKeysError(f"{path}: {exc}") from exc

    def authenticate(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Principal:
        key = _key_of(metadata or ())
        # A dict lookup by digest leaks no timing about stored keys: an attacker cannot steer
        # the digest of a guessed key towards a stored one.
        tenant = self._tenant_of.get(hash_key(key))
        if tenant is None:
            raise Unauthenticated("unknown API key")
        return Principal(tenant, admin=tenant == self._admin_tenant)


def _key_of(metadata: Sequence[tuple[str, str | bytes]]) -> str:
    for name, value in metadata:
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if name == "authorization":
            scheme, _, key = text.partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                raise Unauthenticated("the authorization header must be 'Bearer <API key>'")
            return key.strip()
        if name == "x-api-key" and text.strip():
            return text.strip()
    raise Unauthenticated("no API key: send 'authorization: Bearer <key>' or 'x-api-key: <key>'")
