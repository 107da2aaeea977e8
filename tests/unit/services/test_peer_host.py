import pytest

from attnstore.server.peers import peer_host


@pytest.mark.parametrize(
    ("peer", "parsed"),
    [
        ("ipv4:10.0.0.7:5000", ("ipv4", "10.0.0.7")),
        ("ipv6:[::1]:5000", ("ipv6", "::1")),
        ("ipv6:[fe80::1%eth0]:443", ("ipv6", "fe80::1%eth0")),
        ("unix:/run/w.sock", ("unix", "/run/w.sock")),
        ("unix-abstract:worker", ("unix-abstract", "worker")),
        ("local", ("", "local")),
    ],
)
def test_a_peer_string_reads_as_its_kind_and_host(peer: str, parsed: tuple[str, str]) -> None:
    assert peer_host(peer) == parsed


def test_two_connections_of_one_host_read_as_one_host() -> None:
    assert peer_host("ipv4:10.0.0.7:5000") == peer_host("ipv4:10.0.0.7:41234")
