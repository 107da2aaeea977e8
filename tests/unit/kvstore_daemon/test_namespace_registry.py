"""NamespaceRegistry with a hand-driven clock and a real file: which namespace a full table
reclaims, and that the file always names exactly the namespaces the registry holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_clock import FakeClock

from kvstore_daemon.namespaces import NamespaceLayout, NamespaceRegistry, NamespaceTableFull

LAYOUT = NamespaceLayout(num_layers=2, kv_heads=2, head_dim=8, chunk_tokens=16, dtype="float16")
IDLE = 10.0


def ns(index: int) -> bytes:
    return bytes([index]) * 16


def registry(path: Path, clock: FakeClock, max_namespaces: int = 3) -> NamespaceRegistry:
    return NamespaceRegistry(path, max_namespaces, 1 << 20, IDLE, clock)


def test_the_least_recently_used_idle_empty_namespace_goes_first(tmp_path: Path) -> None:
    clock, holding = FakeClock(), {ns(1)}
    table = registry(tmp_path / "ns.msgpack", clock)
    for index in (1, 2, 3):
        table.register(ns(index), LAYOUT, holding.__contains__)
        clock.now += 1
    table.get(ns(2))  # order of use: 1, 3, 2
    with pytest.raises(NamespaceTableFull, match="max_namespaces"):
        table.register(ns(4), LAYOUT, holding.__contains__)  # nothing idle yet

    clock.now += IDLE
    table.register(ns(4), LAYOUT, holding.__contains__)  # 1 holds chunks: 3 goes
    assert [n in table for n in (ns(1), ns(2), ns(3), ns(4))] == [True, True, False, True]
    table.register(ns(5), LAYOUT, holding.__contains__)  # then 2
    assert ns(2) not in table
    with pytest.raises(NamespaceTableFull):  # 4 and 5 are recent; the scan stops at 4
        table.register(ns(6), LAYOUT, holding.__contains__)

    reloaded = registry(tmp_path / "ns.msgpack", clock)
    assert [n in reloaded for n in (ns(1), ns(4), ns(5))] == [True] * 3 and len(reloaded) == 3


def test_a_change_the_disk_refused_is_saved_by_the_next_upkeep(tmp_path: Path) -> None:
    blocker = tmp_path / "ssd"
    blocker.write_text("a file where the directory should be")  # every save fails
    clock = FakeClock()
    table = registry(blocker / "ns.msgpack", clock)
    table.register(ns(1), LAYOUT, lambda _: False)  # kept in memory
    table.save_if_changed()
    assert ns(1) in table and not (blocker / "ns.msgpack").exists()

    blocker.unlink()  # room again
    table.save_if_changed()
    assert ns(1) in registry(blocker / "ns.msgpack", clock)
