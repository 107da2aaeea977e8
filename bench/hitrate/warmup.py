"""The calibration's one tier over the whole Mooncake hour, window by window: the issue
quotes its learned policy warm-started (28-29% of the gap where cold 20-24%). An online
learner warms up on its own past, so each later window of the hour shows what it is
worth warm, reading nothing of the future.

The store keeps the size of the 10-minute calibration (`--capacity` of the first 10
minutes' working set, 1% + 10% by default), on the `arrival` schedule (calibration.py).
Per window of `--window-minutes`: each policy's hit rate, the optimum's (the prefix
optimum up to the window's end less the one up to its start: MIN's hits in a window
depend on little beyond it) and the share of the LRU-to-optimum gap each closes.

`python -m bench.hitrate.warmup` (about 10 minutes here at load 12): a table, the summary
as the last line (JSON), and bench/results/<--results-name>.json.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from bench.common.results import print_report
from bench.hitrate.calibration import POLICIES, Step, arrival_schedule, lookup_hits, optimal_rate, save_run
from bench.hitrate.workloads import CHUNK_BYTES, MOONCAKE_TRACE, load_mooncake


def _window_rates(steps: list[Step], hits: list[int], window_s: float) -> list[float]:
    """Hit rate per window of the lookups' hits (`hits` in the lookups' order)."""
    counts: dict[int, list[int]] = {}
    for step, hit in zip((step for step in steps if step.lookup), hits, strict=True):
        window = counts.setdefault(int(step.time_s // window_s), [0, 0])
        window[0] += hit
        window[1] += len(step.keys)
    return [hit / looked for hit, looked in (counts[w] for w in sorted(counts))]


def optimal_window_rates(steps: list[Step], capacity: int, window_s: float) -> list[float]:
    """MIN's hit rate per window, as differences of the optima of the prefixes."""
    rates, before_hits, before_looked = [], 0.0, 0
    windows = int(max(step.time_s for step in steps if step.lookup) // window_s) + 1  # the last lookup's
    for window in range(1, windows + 1):
        prefix = [step for step in steps if step.time_s < window * window_s]
        looked = sum(len(step.keys) for step in prefix if step.lookup)
        hits = optimal_rate(prefix, capacity) * looked
        rates.append((hits - before_hits) / (looked - before_looked))
        before_hits, before_looked = hits, looked
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mooncake-trace", type=Path, default=MOONCAKE_TRACE)
    parser.add_argument("--capacity", type=float, default=0.11, help="of the first 10 minutes' working set")
    parser.add_argument("--window-minutes", type=float, default=10.0)
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--results-name", default="hitrate-warmup")
    args = parser.parse_args(argv)
    started, load_before = time.monotonic(), os.getloadavg()
    capacity = int(load_mooncake(10, args.mooncake_trace).working_set_bytes // CHUNK_BYTES * args.capacity)
    steps = arrival_schedule(load_mooncake(None, args.mooncake_trace))
    window_s = args.window_minutes * 60
    rates = {"optimal": optimal_window_rates(steps, capacity, window_s)}
    policies = ["lru", *(policy for policy in args.policies if policy != "lru")]
    for policy in policies:
        rates[policy] = _window_rates(steps, list(lookup_hits(steps, capacity, policy)), window_s)
    rows: list[dict[str, Any]] = []
    for window, optimal in enumerate(rates["optimal"]):
        row: dict[str, Any] = {"window_start_min": window * args.window_minutes, "optimal": round(optimal, 4)}
        lru = rates["lru"][window]
        for policy in policies:
            row[policy] = round(rates[policy][window], 4)
            if policy != "lru":
                row[f"{policy}_gap_closed"] = round((rates[policy][window] - lru) / (optimal - lru), 3)
        rows.append(row)
    warm = rows[1:]  # every window after the first
    summary = {
        f"{policy}_gap_closed_{when}": round(sum(r[f"{policy}_gap_closed"] for r in part) / len(part), 3)
        for policy in policies[1:]
        for when, part in (("first_window", rows[:1]), ("warm_mean", warm or rows[:1]))
    }
    save_run(args.results_name, started, load_before, summary=summary, results=rows, capacity_chunks=capacity)
    header = "| minutes | LRU | optimum | " + " | ".join(f"{p}: hit, gap closed" for p in policies[1:]) + " |"
    lines = [header, "|---" * (3 + len(policies[1:])) + "|"] + [
        f"| {r['window_start_min']:g}-{r['window_start_min'] + args.window_minutes:g} | {r['lru']:.2%} | "
        f"{r['optimal']:.2%} | "
        + " | ".join(f"{r[p]:.2%}, {r[f'{p}_gap_closed']:.1%}" for p in policies[1:])
        + " |"
        for r in rows
    ]
    print_report("\n".join(lines), [], summary)


if __name__ == "__main__":
    main()
