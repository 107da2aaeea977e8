"""The calling host of a gRPC peer string ("ipv4:10.0.0.7:5000", "ipv6:[::1]:5000",
"unix:/run/w.sock"): the daemon keys its rate limits by it, the worker names an unnamed
home by it. One parser, so both read a peer the same way."""

from __future__ import annotations


def peer_host(peer: str) -> tuple[str, str]:
    """(kind, host): the port and IPv6 brackets dropped, a unix socket's path as its host;
    a string with no kind is ("", the string)."""
    kind, found, address = peer.partition(":")
    if not found:
        return "", peer
    if kind in ("ipv4", "ipv6") and ":" in address:
        address = address.rpartition(":")[0].strip("[]")
    return kind, address or peer
