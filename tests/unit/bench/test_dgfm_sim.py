"""The DGFM simulation (bench/longctx/dgfm_sim.py): without defragmentation the remote
share of blocks grows to about twice its first period's; with it, it stays flat and well
below."""

from __future__ import annotations

from bench.longctx.dgfm_sim import per_period, simulate


def test_remote_share_flat_with_dgfm_and_growing_without() -> None:
    without = per_period(simulate(dgfm_every=None, steps=960))
    with_dgfm = per_period(simulate(dgfm_every=10, steps=960))
    assert without[-1] > 1.6 * without[0]
    assert max(with_dgfm[1:]) - min(with_dgfm[1:]) < 0.03
    assert all(w < 0.75 * wo for w, wo in zip(with_dgfm[1:], without[1:], strict=True))
