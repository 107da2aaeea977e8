"""A pool of daemons under TLS and internal auth: the borrower calls its peer with the
pool_channel credentials (the peers' CA, a client certificate, the internal token) over
gRPC and the peer's TLS data plane; evicted chunks land on the peer and come back
byte-identical, to the borrower and to a reader that fetches them from the peer itself.
A borrower without credentials for its peers is refused at start."""

from __future__ import annotations

import ssl
import time

import pytest
from secure_stack import (
    LAYOUT,
    NAMESPACE,
    channel,
    credentials,
    internal_auth,
    make_chunks,
    server_tls,
)
from service_probes import free_port

from attnstore.kvstore_client import KVStoreClient, Tier

KiB = 1024
MiB = 1024 * KiB
SMALL_TIERS = {
    "dram_capacity_bytes": MiB, "dram_block_bytes": 64 * KiB, "ssd_capacity_bytes": MiB, "ssd_reserved_bytes": 0,
    "max_chunk_bytes": 256 * KiB, "eviction_policy": "lru",
}  # fmt: skip
COUNT = 240  # of 6 KiB: more than the borrower's DRAM (16 blocks) and SSD (1 MiB) hold


def tls_context(pki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(pki.client_cert, pki.client_key)
    return context


def test_evicted_chunks_travel_to_the_peer_and_back_under_tls_and_tokens(daemon_factory, pki, tokens) -> None:
    secure = {"tls": server_tls(pki, mutual=True), "internal_auth": internal_auth()}
    lender = daemon_factory({**secure, "data_plane_port": free_port()})
    borrower = daemon_factory({
        **secure, **SMALL_TIERS, "data_plane_port": free_port(), "pool_peers": [lender.address],
        "pool_capacity_bytes": 64 * MiB, "pool_channel": channel(pki, cert=True, token=tokens.worker),
    })  # fmt: skip
    stored = make_chunks(COUNT, seed=31)
    keys = list(stored)
    reader = {
        "credentials": credentials(pki, cert=True, token=tokens.worker),
        "data_plane_tls": tls_context(pki),
    }
    with KVStoreClient(borrower.address, use_shm=False, **reader) as client:
        client.register_namespace(NAMESPACE, **LAYOUT)
        for key, data in stored.items():
            client.put_chunks(NAMESPACE, {key: data}, durable=True)
        deadline = time.monotonic() + 10
        while (tiers := client.lookup(NAMESPACE, keys[:1]).tiers) != [Tier.PEER]:
            assert time.monotonic() < deadline, f"the oldest chunk never reached the peer: {tiers}"
            time.sleep(0.1)
        assert client.lookup(NAMESPACE, keys[:1]).peers == [lender.address]
        assert client.get_whole_chunks(NAMESPACE, keys[:1]) == [stored[keys[0]]]  # via the borrower
    assert (
        "data_plane_unreachable" not in borrower.log_path.read_text()
    )  # its peer's TLS data plane took the bytes
    with KVStoreClient(lender.address, use_shm=False, **reader) as peer:  # straight from the peer
        assert peer.get_whole_chunks(NAMESPACE, keys[1:2]) == [stored[keys[1]]]
        assert peer.client_stats().transport == "dataplane"


def test_a_secure_daemon_without_credentials_for_its_peers_is_refused(daemon_factory, pki, tokens) -> None:
    secure = {"tls": server_tls(pki, mutual=False), "internal_auth": internal_auth()}
    with pytest.raises(RuntimeError, match="pool_channel"):
        daemon_factory({**secure, "pool_peers": ["127.0.0.1:1"], "pool_capacity_bytes": MiB})
