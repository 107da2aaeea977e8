"""Internal auth of the daemon and the worker: who may call them besides health checks.

A caller is *internal* when it presents a client certificate the server verified (mutual
TLS, `tls.require_client_cert`) or an internal token; it is *admin* when it presents an
admin token. Admin calls (the daemon's Hint, Pin, Unpin, Stats) need an admin token:
certificates here are issued per deployment, not per role, so they cannot tell the
scheduler from a worker. Tokens are kept only as sha256 hex digests
(`printf %s "$TOKEN" | sha256sum`); callers send `authorization: Bearer <token>`.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from attnstore.security.tls import ServerTLS

# pydantic matches with Rust's regex engine, whose `$` is the end of the text (Python's
# would also accept a trailing newline); a test holds it to that.
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{64}$", to_lower=True)]


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class InternalAuth(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        False,
        description="callers other than health checks must present a verified client certificate or a token",
    )
    token_sha256: tuple[Sha256Hex, ...] = Field(
        (), description="sha256 hex digests of the internal tokens accepted (the workers')"
    )
    admin_token_sha256: tuple[Sha256Hex, ...] = Field(
        (),
        description="sha256 hex digests of the admin tokens (the scheduler's, operators'): admin calls "
        "need one; they count as internal tokens too",
    )

    @model_validator(mode="after")
    def _check(self) -> InternalAuth:
        if not self.enabled and (self.token_sha256 or self.admin_token_sha256):
            raise ValueError("token digests are set but enabled is false: nothing would check them")
        return self


def check_server_security(tls: ServerTLS, auth: InternalAuth) -> None:
    """The cross-field rules of a server's TLS and internal auth (ValueError otherwise)."""
    if not auth.enabled:
        return
    if not tls.enabled:
        raise ValueError("internal_auth needs tls: a token sent over plaintext can be read and replayed")
    if not (tls.require_client_cert or auth.token_sha256 or auth.admin_token_sha256):
        raise ValueError(
            "internal_auth needs a credential to check: tls.require_client_cert, token_sha256 or "
            "admin_token_sha256"
        )
