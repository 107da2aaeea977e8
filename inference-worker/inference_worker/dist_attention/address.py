"""Addresses other workers hand this one (a turn's peers, a segment's home, a lender's
daemon): checked before they are dialled or recorded, so a malformed one is the sender's
INVALID_ARGUMENT with its value, not a failed connection later."""

from __future__ import annotations

from attnstore.errors import InvalidArgument

MAX_ADDRESS_CHARS = 255  # a DNS name is at most 253 characters, plus the port


def check_address(address: str, what: str) -> str:
    """`address` when it may be a gRPC target (non-empty, at most MAX_ADDRESS_CHARS, no
    whitespace); InvalidArgument naming `what` otherwise."""
    if not address or len(address) > MAX_ADDRESS_CHARS or any(c.isspace() for c in address):
        raise InvalidArgument(
            f"{what} {address[:80]!r} is not a gRPC target (host:port, 1-{MAX_ADDRESS_CHARS} characters, "
            "no whitespace)"
        )
    return address
