"""What the load benchmark reports: per run (one N), throughput, TTFT percentiles (all
turns, and cached turns: a session's second turn or later that reused KV), failures, hit
rate and each service's memory after warm-up; then the summary over runs and the targets
(reported, never gating the exit code).

Memory growth after warm-up, per service: the median of its samples in the last quarter
of the measured window over the median of its first samples after warm-up (the first
tenth of the window, at least 3), minus 1, in percent; medians, because a Python heap
moves by a few MB from one second to the next. The headline is the largest growth of any
service, on private memory (see sampler.py: the shared arena's pages are excluded;
RSS growth is reported beside it).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.load.driver import TurnRecord
from bench.load.sampler import MachineSample, Sample

MiB = 1024 * 1024
TARGET_P99_OVER_P50 = 3.0
TARGET_MEMORY_GROWTH_PCT = 5.0  # "no growth": within the noise of a Python heap


def percentile(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def _growth_pct(series: list[float]) -> float | None:
    if len(series) < 8:
        return None
    head = series[: max(3, len(series) // 10)]
    tail = series[-max(2, len(series) // 4) :]
    base = statistics.median(head)
    return round((statistics.median(tail) / base - 1) * 100, 2) if base else None


def resource_summary(
    samples: list[Sample], window: tuple[float, float], turns: int
) -> dict[str, dict[str, Any]]:
    """Per service: memory after warm-up, at the end, its peak and growth; CPU time per turn."""
    out = {}
    for service in sorted({s.service for s in samples}):
        inside = [s for s in samples if s.service == service and window[0] <= s.seconds <= window[1]]
        if not inside:
            continue
        cpu_seconds = inside[-1].cpu_seconds - inside[0].cpu_seconds
        out[service] = {
            "private_growth_pct": _growth_pct([s.private_bytes for s in inside]),
            "rss_growth_pct": _growth_pct([s.rss_bytes for s in inside]),
            "private_mib_after_warmup": round(inside[0].private_bytes / MiB, 1),
            "private_mib_end": round(inside[-1].private_bytes / MiB, 1),
            "private_mib_peak": round(max(s.private_bytes for s in inside) / MiB, 1),
            "rss_mib_end": round(inside[-1].rss_bytes / MiB, 1),
            "cpu_cores_busy": round(cpu_seconds / (inside[-1].seconds - inside[0].seconds), 2),
            "cpu_ms_per_turn": round(cpu_seconds * 1000 / turns, 1) if turns else None,
        }
    return out


def cpu_summary(
    machine: list[MachineSample], samples: list[Sample], window: tuple[float, float]
) -> dict[str, float]:
    """Cores busy in `window`: the whole machine, the services, the load client, and the
    rest (other processes on this shared machine); and cores stolen by the hypervisor."""
    inside = [m for m in machine if window[0] <= m.seconds <= window[1]]
    if len(inside) < 2:
        return {}
    first, last = inside[0], inside[-1]
    seconds = last.seconds - first.seconds
    services = 0.0
    for service in {s.service for s in samples}:
        mine = [s for s in samples if s.service == service and first.seconds <= s.seconds <= last.seconds]
        services += mine[-1].cpu_seconds - mine[0].cpu_seconds if mine else 0.0
    machine_busy = last.busy_cpu_seconds - first.busy_cpu_seconds
    client = last.client_cpu_seconds - first.client_cpu_seconds
    return {
        "machine": round(machine_busy / seconds, 2),
        "services": round(services / seconds, 2),
        "load_client": round(client / seconds, 2),
        "other_processes": round((machine_busy - services - client) / seconds, 2),
        "stolen": round((last.steal_cpu_seconds - first.steal_cpu_seconds) / seconds, 2),
    }


def summarize_run(
    sessions: int,
    turns: list[TurnRecord],
    failed_session_calls: list[str],
    samples: list[Sample],
    machine: list[MachineSample],
    window: tuple[float, float],
) -> dict[str, Any]:
    """One run: `window` is (end of warm-up, deadline) on the driver's clock. TTFT and hit
    rate are over the turns started in it; throughput over the turns completed in it."""
    start, end = window
    measured = [t for t in turns if start <= t.started < end]
    completed = sum(1 for t in turns if t.error is None and start <= t.ended < end)
    ok = [t for t in measured if t.error is None]
    cached = [t for t in ok if t.session_turn >= 2 and t.reused_tokens > 0]
    later = [t for t in ok if t.session_turn >= 2]
    all_p50, cached_p50 = percentile([t.ttft_ms for t in ok], 50), percentile([t.ttft_ms for t in cached], 50)
    cached_p99 = percentile([t.ttft_ms for t in cached], 99)
    prompt = sum(t.prompt_tokens for t in ok)
    failed = [t for t in turns if t.error is not None]
    errors = [t.error for t in failed]
    return {
        "sessions": sessions,
        "measured_seconds": round(end - start, 1),
        "turns": len(ok),
        "throughput_turns_per_s": round(completed / (end - start), 2),
        "ttft_ms": {"p50": all_p50, "p99": percentile([t.ttft_ms for t in ok], 99)},
        "cached_turns": len(cached),
        "cached_share_of_later_turns": round(len(cached) / len(later), 3) if later else None,
        "cached_ttft_ms": {"p50": cached_p50, "p99": cached_p99},
        "p99_over_p50_cached_ttft": round(cached_p99 / cached_p50, 3) if cached_p50 and cached_p99 else None,
        "failed_turns": len(errors),  # warm-up included
        "failed_turn_codes": {code: errors.count(code) for code in sorted(set(errors))},
        "failed_turn_examples": sorted(
            {f"{t.error} at {t.started:.0f} s: {t.details[:300]}" for t in failed}
        )[:5],
        "failed_session_calls": len(failed_session_calls),
        "hit_rate": round(sum(t.reused_tokens for t in ok) / prompt, 4) if prompt else None,
        "mean_prompt_tokens": round(prompt / len(ok), 1) if ok else None,
        "services": resource_summary(samples, window, completed),
        "cpu_cores_busy": cpu_summary(machine, samples, window),
    }


def _worst_growth(runs: list[dict[str, Any]]) -> tuple[float | None, str]:
    """The largest private-memory growth of any service in `runs`, and where."""
    growth = [
        (m["private_growth_pct"], f"{name} at N={r['sessions']}")
        for r in runs
        for name, m in r["services"].items()
        if m["private_growth_pct"] is not None
    ]
    return max(growth, default=(None, "-"))


def summarize(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The headline over every run, and one PASS/FAIL line per target."""
    worst, where = _worst_growth(runs)
    ratios = [r["p99_over_p50_cached_ttft"] for r in runs if r["p99_over_p50_cached_ttft"] is not None]
    rss = [
        m["rss_growth_pct"] for r in runs for m in r["services"].values() if m["rss_growth_pct"] is not None
    ]
    summary: dict[str, Any] = {
        "failed_turns": sum(r["failed_turns"] for r in runs),
        "failed_session_calls": sum(r["failed_session_calls"] for r in runs),
        "p99_over_p50_cached_ttft": max(ratios, default=None),
        "memory_growth_after_warmup_pct": worst,
        "memory_growth_worst_service": where,
        "rss_growth_after_warmup_pct": max(rss, default=None),
    }
    for r in runs:
        n = r["sessions"]
        summary[f"throughput_turns_per_s_n{n}"] = r["throughput_turns_per_s"]
        summary[f"hit_rate_n{n}"] = r["hit_rate"]
        summary[f"cached_ttft_p50_ms_n{n}"] = r["cached_ttft_ms"]["p50"]
        summary[f"cached_ttft_p99_ms_n{n}"] = r["cached_ttft_ms"]["p99"]
    verdicts = {
        "zero failed turns": summary["failed_turns"] == 0,
        f"memory growth after warm-up <= {TARGET_MEMORY_GROWTH_PCT:g}%": worst is not None
        and worst <= TARGET_MEMORY_GROWTH_PCT,
        f"p99 TTFT of cached turns <= {TARGET_P99_OVER_P50:g}x p50": bool(ratios)
        and max(ratios) <= TARGET_P99_OVER_P50,
    }
    summary["pass"] = verdicts
    lines = [f"{'PASS' if ok else 'FAIL'}  {target}" for target, ok in verdicts.items()]
    return summary, lines


def _table(columns: list[tuple[str, int]], rows: list[list[Any]]) -> str:
    """Columns of (name, width): right-aligned, left-aligned for a negative width."""

    def line(cells: list[Any]) -> str:
        return " ".join(
            f"{cell!s:>{width}}" if width > 0 else f"{cell!s:<{-width}}"
            for cell, (_, width) in zip(cells, columns, strict=True)
        )

    header = line([name for name, _ in columns])
    return "\n".join([header, "-" * len(header), *(line(row) for row in rows)])


def format_table(runs: list[dict[str, Any]]) -> str:
    columns = [
        ("N", 4),
        ("turns/s", 8),
        ("turns", 6),
        ("TTFT p50", 9),
        ("p99", 7),
        ("cached p50", 11),
        ("p99", 7),
        ("p99/p50", 8),
        ("hit rate", 9),
        ("failed", 7),
        ("worst private growth", 30),
    ]
    rows = []
    for r in runs:
        worst, where = _worst_growth([r])
        rows.append(
            [
                r["sessions"],
                r["throughput_turns_per_s"],
                r["turns"],
                r["ttft_ms"]["p50"],
                r["ttft_ms"]["p99"],
                r["cached_ttft_ms"]["p50"],
                r["cached_ttft_ms"]["p99"],
                r["p99_over_p50_cached_ttft"],
                r["hit_rate"],
                r["failed_turns"],
                f"{worst:+.1f}% ({where})" if worst is not None else "-",
            ]
        )
    return _table(columns, rows)


def format_memory(runs: list[dict[str, Any]]) -> str:
    columns = [
        ("N", 4),
        ("service", -14),
        ("private MiB start", 18),
        ("end", 7),
        ("peak", 7),
        ("growth %", 9),
        ("RSS MiB end", 12),
        ("RSS growth %", 13),
        ("CPU cores", 10),
        ("CPU ms/turn", 12),
    ]
    keys = [
        "private_mib_after_warmup",
        "private_mib_end",
        "private_mib_peak",
        "private_growth_pct",
        "rss_mib_end",
        "rss_growth_pct",
        "cpu_cores_busy",
        "cpu_ms_per_turn",
    ]
    rows = [
        [r["sessions"], name, *(m[key] for key in keys)] for r in runs for name, m in r["services"].items()
    ]
    return _table(columns, rows)


def format_cpu(runs: list[dict[str, Any]]) -> str:
    """One line per run: where the machine's cores went during the measured window."""
    return "\n".join(
        f"N={r['sessions']}: cores busy {c['machine']} = services {c['services']} + load client "
        f"{c['load_client']} + other processes {c['other_processes']}; stolen by the hypervisor {c['stolen']}"
        for r in runs
        if (c := r["cpu_cores_busy"])
    )
