"""The learned hit density (hit_density.py) against hand-computed values."""

from __future__ import annotations

import pytest

from kvstore_daemon.hit_density import MIN_CLASS_ENDS, HitDensity, age_bin


def test_density_is_the_chance_of_a_read_over_the_wait_for_it() -> None:
    learner = HitDensity(classes=1)
    for _ in range(3):
        learner.hit(0, 4)  # bin 0: [0, 8), midpoint 4
    learner.evicted(0)  # one of four spells ended unread
    assert learner.density(0, 0) == pytest.approx(0.75 / 4)  # P = 3/4, wait = 4 ticks
    assert learner.density(0, 100) == 0.0  # no read was ever seen this late


def test_reads_beyond_an_age_raise_the_density_as_the_age_nears_them() -> None:
    learner = HitDensity(classes=3)
    for _ in range(10):
        learner.hit(0, 1000)
        learner.evicted(0)
    young, due = learner.density(0, 0), learner.density(0, 900)
    assert 0 < young < due
    assert learner.density(1, 900) == due  # class 1 has learned nothing: ranked as all classes pooled
    for _ in range(MIN_CLASS_ENDS - 1):
        learner.evicted(1)
    pooled = learner.density(2, 900)  # class 2 has learned nothing
    assert learner.density(1, 900) == pooled > 0  # one end short of speaking for itself: still pooled
    learner.evicted(1)
    assert learner.density(1, 900) == 0.0  # now it speaks for itself: never read


def test_an_undone_eviction_is_forgotten() -> None:
    learner = HitDensity(classes=1)
    learner.hit(0, 4)
    before = learner.density(0, 0)
    learner.evicted(0)
    learner.evicted(0, undo_from=learner.epoch)
    learner.hit(0, 4)  # the same spell, read after all
    assert learner.density(0, 0) == pytest.approx(before)


def test_counts_halve_after_the_half_life_so_new_behaviour_wins() -> None:
    learner = HitDensity(classes=1, half_life_events=4)
    for _ in range(4):
        learner.evicted(0)  # halved to 2 at the fourth
    for _ in range(2):
        learner.hit(0, 4)
    assert learner.density(0, 0) == pytest.approx(0.5 / 4)  # 2 reads of 4 spells, not 2 of 6


def test_an_eviction_undone_after_a_halving_is_taken_back_at_its_halved_weight() -> None:
    learner = HitDensity(classes=1, half_life_events=4)
    recorded_at = learner.epoch
    for _ in range(4):
        learner.evicted(0)  # 4 unread ends, halved to 2 at the fourth
    assert learner.epoch == recorded_at + 1
    learner.evicted(0, undo_from=recorded_at)  # one of them was needed after all: it weighs 0.5 now
    learner.hit(0, 4)
    # 1 read of 2.5 spells (taken back whole: of 2)
    assert learner.density(0, 0) == pytest.approx(1 / 2.5 / 4)


def test_age_bins_grow_geometrically_and_cap() -> None:
    assert age_bin(0) == age_bin(7.9) == 0
    assert age_bin(8) == 1
    assert age_bin(10**12) == age_bin(10**15)
    with pytest.raises(ValueError):
        HitDensity(classes=0)
