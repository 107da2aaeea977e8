"""The calibration's LHD (bench/hitrate/lhd.py): its densities by hand, and its ranking
after it has learned that one class of chunk is read again and another never is."""

from __future__ import annotations

from bench.hitrate import lhd
from bench.hitrate.lhd import LHD, _densities


def test_density_is_hits_beyond_an_age_over_the_lifetime_beyond_it() -> None:
    hits, evictions = [0.0] * lhd.BINS, [0.0] * lhd.BINS
    hits[0], evictions[1] = 1.0, 1.0  # one life read in bin 0, one evicted unread in bin 1
    table = _densities(hits, evictions)
    assert table[1] == 0.0  # nothing is read beyond bin 1
    assert table[0] == 1.0 / 3.0  # one hit over 2 + 1 bins of lifetime left
    assert all(density == 0.0 for density in table[2:])


def test_it_evicts_the_class_that_is_never_read_again() -> None:
    policy, children = LHD(), {}
    shallow, deep = lhd.DEPTH_EDGES[0] - 1, lhd.DEPTH_EDGES[-1]  # two depth classes
    for life in range(lhd.DECAY_EVENTS):  # enough ends for the densities to be computed
        policy.now = float(life)
        read, unread = f"read{life}".encode(), f"unread{life}".encode()
        policy.stored(read, shallow)
        policy.stored(unread, deep)
        policy.now += lhd.BIN_S * 5.5  # read at an age in bin 5
        policy.hit(read)
        policy.removed(read)
        policy.removed(unread)
    policy.stored(b"shallow", shallow)
    policy.stored(b"deep", deep)
    policy.now += lhd.BIN_S  # both idle one bin: only the shallow class is read beyond
    assert policy.density(b"shallow") > policy.density(b"deep") == 0.0
    assert policy.victim(children) == b"deep"
