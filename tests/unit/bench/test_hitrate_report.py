"""bench-hitrate's issue-20 summary: gap closed per workload and capacity, ShareGPT's runs
with end signals and with conversation_over reported under ShareGPT, targets as lines."""

from __future__ import annotations

from bench.hitrate.report import dram_share_ceiling, gap_closed, summarize_predictive, window_gaps_closed
from bench.hitrate.sim import ReplayResult, equal_odds_dram_hits


def _row(workload: str, policy: str, hit: float, dram: float = 0.01, optimal: float = 0.5) -> dict:
    return {
        "workload": workload,
        "policy": policy,
        "dram_fraction": dram,
        "ssd_fraction": dram * 10,
        "hit_rate": hit,
        "optimal_hit_rate": optimal,
        "dram_share_of_hits": 0.9,
    }


def test_ended_sharegpt_runs_are_reported_under_sharegpt_and_targets_are_checked() -> None:
    rows = [_row(w, "lru", 0.1) for w in ("mooncake", "sharegpt", "sharegpt-end", "sharegpt-over")] + [
        _row("mooncake", "predictive", 0.2),  # closes 0.1 / 0.4 of the gap
        _row("sharegpt", "predictive", 0.05),  # below LRU
        {**_row("sharegpt-end", "predictive", 0.3), "chooser_follows": "lru"},
        _row("sharegpt-over", "predictive", 0.4),
        _row("mooncake", "lru", 0.1, dram=0.005),
        _row("mooncake", "predictive", 0.3, dram=0.005),
    ]
    summary, lines = summarize_predictive(rows)
    assert summary["mooncake"]["predictive_gap_closed"] == 0.25
    assert summary["mooncake"]["predictive_gap_closed_by_capacity"] == {"1%/10%": 0.25, "0.5%/5%": 0.5}
    assert summary["sharegpt"]["predictive_gap_closed"] == -0.125
    assert summary["sharegpt"]["predictive_gap_closed_with_end_signals"] == 0.5
    assert summary["sharegpt"]["predictive_gap_closed_with_conversation_over"] == 0.75
    assert summary["sharegpt"]["predictive_order_followed_by_capacity_with_end_signals"] == {"1%/10%": "lru"}
    assert "predictive_order_followed_by_capacity" not in summary["mooncake"]  # no chooser in those rows
    assert (
        "FAIL  mooncake 1%/10%: predictive closes 0.25 of the LRU-to-optimum gap (target >= 20%, stretch 30%)"
        not in lines
    )  # 0.25 passes the 20% target
    assert any(
        line.startswith("FAIL  sharegpt 1%/10%: predictive 5.0% vs LRU 10.0% (never below LRU)")
        for line in lines
    )
    assert any(line.startswith("PASS  sharegpt-end 1%/10%: predictive closes 0.5") for line in lines)


def test_no_gap_no_share() -> None:
    assert gap_closed(0.3, 0.3, 0.3) is None
    assert gap_closed(0.2, 0.1, 0.3) == 0.5


def test_the_dram_share_ceiling_counts_the_turns_that_started_on_arrival_as_they_were() -> None:
    # 90% of the hits from turns that waited, the other 10% 40% from DRAM: at most 94%.
    predictive = {
        **_row("mooncake", "predictive", 0.2),
        "waited_share_of_hits": 0.9,
        "started_dram_share_of_hits": 0.4,
    }
    assert dram_share_ceiling(predictive) == 0.94
    assert dram_share_ceiling(_row("mooncake", "predictive", 0.2)) is None  # rows from before the split
    summary, lines = summarize_predictive([_row("mooncake", "lru", 0.1), predictive])
    assert summary["mooncake"]["predictive_dram_share_ceiling"] == 0.94
    assert (
        "FAIL  mooncake 1%/10%: 90.0% of predictive's hits from DRAM (target >= 95%; 94.0% if every queued "
        "turn's came from DRAM)" in lines
    )


def test_the_replay_splits_the_dram_share_by_whether_a_turn_waited() -> None:
    result = ReplayResult(hit_blocks=10, dram_hit_blocks=8, waited_hit_blocks=6, waited_dram_hit_blocks=6)
    summary = result.summary()
    assert summary["waited_share_of_hits"] == 0.6
    assert summary["started_dram_share_of_hits"] == 0.5  # 2 of the other 4 hits from DRAM
    assert dram_share_ceiling(summary) == 0.8


def test_the_gap_closed_is_reported_per_window_against_lrus_windows() -> None:
    def windows(*hits: float) -> list[dict]:
        return [
            {"start_s": 600.0 * i, "hit_rate": hit, "optimal_hit_rate": 0.5} for i, hit in enumerate(hits)
        ]

    lru = {**_row("mooncake", "lru", 0.1), "windows": windows(0.1, 0.3, 0.5)}
    predictive = {**_row("mooncake", "predictive", 0.2), "windows": windows(0.2, 0.4, 0.5)}
    assert window_gaps_closed(predictive, lru) == [0.25, 0.5, None]  # no gap left in the last window
    summary, lines = summarize_predictive([lru, predictive])
    assert summary["mooncake"]["predictive_gap_closed_by_window"] == {"1%/10%": [0.25, 0.5, None]}
    assert "INFO  mooncake 1%/10%: predictive's gap closed per 10 minutes: 25.0%, 50.0%, n/a" in lines
    one_window = {**predictive, "windows": windows(0.2)}
    assert "predictive_gap_closed_by_window" not in summarize_predictive([lru, one_window])[0]["mooncake"]


def test_the_dram_share_bound_gives_the_started_turns_the_share_of_returning_chains_dram_holds() -> None:
    assert equal_odds_dram_hits(4, dram_chunks=4, others_chunks=8) == 4 / 3
    assert equal_odds_dram_hits(4, dram_chunks=100, others_chunks=8) == 4  # everything fits
    assert equal_odds_dram_hits(0, dram_chunks=4, others_chunks=0) == 0
    # Half the hits waited (all reachable), the others at most 40% from DRAM: 70%.
    predictive = {
        **_row("sharegpt", "predictive", 0.2),
        "waited_share_of_hits": 0.5,
        "started_dram_share_of_hits": 0.3,
        "started_dram_share_bound": 0.4,
    }
    assert dram_share_ceiling(predictive, "started_dram_share_bound") == 0.7
    summary, lines = summarize_predictive([_row("sharegpt", "lru", 0.1), predictive])
    assert summary["sharegpt"]["predictive_dram_share_bound"] == 0.7
    assert (
        "FAIL  sharegpt 1%/10%: 90.0% of predictive's hits from DRAM (target >= 95%; 65.0% if every queued "
        "turn's came from DRAM, at most 70.0% with the other turns' at equal odds)" in lines
    )
    result = ReplayResult(hit_blocks=10, waited_hit_blocks=6, started_dram_bound_hit_blocks=1.0)
    assert result.summary()["started_dram_share_bound"] == 0.25
    assert ReplayResult().summary()["started_dram_share_bound"] is None
