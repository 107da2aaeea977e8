"""The debt graph's encoding in the ledger (pool_debts.py): a creditor's hash of debtor ->
bytes read back as edges (debtor, creditor), with and without decoded responses; no
debt at zero."""

from __future__ import annotations

from attnstore.debt_graph import plan_swaps
from attnstore.pool_debts import edges


def test_a_creditors_hash_reads_as_edges_from_its_debtors() -> None:
    raw = {b"10.0.0.1:50061": b"4096", b"10.0.0.2:50061": b"0", b"10.0.0.3:50061": b"-5"}
    assert edges("10.0.0.9:50061", raw) == {("10.0.0.1:50061", "10.0.0.9:50061"): 4096}
    assert edges("b", {"a": "7"}) == {("a", "b"): 7}  # decode_responses=True
    assert edges("b", {}) == {}


def test_two_creditors_hashes_make_a_two_cycle_for_dgfm() -> None:
    graph = edges("b", {b"a": b"500"}) | edges("a", {b"b": b"400", b"c": b"100"})
    [swap] = plan_swaps(graph, min_swap_bytes=100)
    assert sorted(swap.cycle) == ["a", "b"] and swap.size_bytes == 400
