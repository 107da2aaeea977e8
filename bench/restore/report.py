"""Rows, table, summary and targets of bench-restore."""

from __future__ import annotations

from typing import Any

METHODS = ("recompute", "kv", "hidden", "planner")
SINGLE_METHODS = ("recompute", "kv", "hidden")
PLANNER_SLACK = 1.05  # the planner is never more than 5% slower than the best single method
THROTTLED_SPEEDUP_TARGET = 1.5  # planner vs KV loading on the throttled tier
HIDDEN_BYTES_TARGET = 0.55  # stored bytes per token of hidden states vs KV (MHA)

Row = dict[str, Any]  # tier, history_tokens, method, seconds, plan, bytes_per_token, read_bytes


def format_table(rows: list[Row]) -> str:
    lines = [
        f"{'tier':<10} {'tokens':>6} {'method':<10} {'plan':<12} {'ms':>9} {'GB/s read':>9} {'B/token':>8}"
    ]
    for row in rows:
        rate = row["read_bytes"] / row["seconds"] / 1e9 if row["seconds"] else 0.0
        lines.append(
            f"{row['tier']:<10} {row['history_tokens']:>6} {row['method']:<10} {row['plan']:<12} "
            f"{row['seconds'] * 1e3:>9.1f} {rate:>9.2f} {row['bytes_per_token']:>8}"
        )
    return "\n".join(lines)


def _seconds(rows: list[Row], tier: str, tokens: int, method: str) -> float:
    return next(
        r["seconds"] for r in rows if (r["tier"], r["history_tokens"], r["method"]) == (tier, tokens, method)
    )


def summarize(rows: list[Row], tiers: list[str], histories: list[int]) -> tuple[dict[str, Any], list[str]]:
    """The worst case over histories of each ratio; PASS/FAIL lines for the issue's targets."""
    vs_best = {
        tier: max(
            _seconds(rows, tier, n, "planner") / min(_seconds(rows, tier, n, m) for m in SINGLE_METHODS)
            for n in histories
        )
        for tier in tiers
    }
    throttled = min(
        _seconds(rows, "throttled", n, "kv") / _seconds(rows, "throttled", n, "planner") for n in histories
    )
    per_token = {r["method"]: r["bytes_per_token"] for r in rows if r["method"] in ("kv", "hidden")}
    hidden_vs_kv = per_token["hidden"] / per_token["kv"]
    summary = {
        "planner_vs_best_single_method": {tier: round(value, 3) for tier, value in vs_best.items()},
        "hidden_vs_kv_bytes": round(hidden_vs_kv, 3),
        "planner_vs_kv_load_throttled": round(throttled, 3),
        "plans": {f"{r['tier']}/{r['history_tokens']}": r["plan"] for r in rows if r["method"] == "planner"},
    }
    verdicts = [
        *(
            f"{'PASS' if value <= PLANNER_SLACK else 'FAIL'} planner vs best single method on {tier}: "
            f"{value:.3f}x (target <= {PLANNER_SLACK})"
            for tier, value in vs_best.items()
        ),
        (
            f"{'PASS' if throttled >= THROTTLED_SPEEDUP_TARGET else 'FAIL'} planner vs KV loading on the throttled "
            f"tier: {throttled:.2f}x faster (target >= {THROTTLED_SPEEDUP_TARGET})"
        ),
        (
            f"{'PASS' if hidden_vs_kv <= HIDDEN_BYTES_TARGET else 'FAIL'} hidden-state bytes per token vs KV: "
            f"{hidden_vs_kv:.3f} (target <= {HIDDEN_BYTES_TARGET})"
        ),
    ]
    return summary, verdicts
