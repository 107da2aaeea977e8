"""What the peers benchmark prints and saves: the store rows with their ratio to LMCache's
server, the serving turns with their medians per phase and turn, the summary ratios and
the issue's targets (reported, never gating the exit code)."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from bench.daemon.report import GRPC, SHM, SHM_LEASED, Row

# The compared systems and phases, named once here (the LMCache driver, run in LMCache's
# venv, imports this module too: it needs nothing beyond the standard library and bench/daemon/report.py).
LMCACHE = "LMCache server (lm://)"  # a row path of the store comparison
VLLM, ATTNSTORE = "vLLM", "attnstore"  # the sides of the serving comparison
Record = dict[str, Any]  # one served turn: side, phase, dialogue, turn, ttft_ms, prompt_tokens...
HEADLINE_SIZE, HEADLINE_CONCURRENCY = "5.9MB", 1
OVER, FITS = "over capacity", "fits"
LATER_TURN = 3  # "later turns": turn >= 3
THROUGHPUT_TARGET = 1.0  # ours / LMCache's, at least
TTFT_TARGET = 0.5  # our median later-turn TTFT / vLLM's, at most


def add_lmcache_ratios(rows: list[Row]) -> None:
    """Each daemon row's throughput over LMCache's at the same op, size and concurrency."""
    theirs = {(r["op"], r["size"], r["concurrency"]): r["gbps"] for r in rows if r["path"] == LMCACHE}
    for row in rows:
        base = theirs.get((row["op"], row["size"], row["concurrency"]))
        row["vs_lmcache"] = round(row["gbps"] / base, 4) if base and row["path"] != LMCACHE else None


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return round(top / bottom, 4) if top is not None and bottom else None


def store_summary(rows: list[Row]) -> dict[str, Any]:
    """Ours / LMCache's throughput at the headline size and concurrency, per path and op;
    `daemon_vs_lmcache_throughput` is gRPC Get (both a byte stream over loopback)."""
    by = {(r["path"], r["op"], r["size"], r["concurrency"]): r["gbps"] for r in rows}
    summary: dict[str, Any] = {}
    for name, path in (("daemon", GRPC), ("daemon_shm", SHM), ("daemon_shm_leased", SHM_LEASED)):
        for op in ("get", "put"):
            for c in sorted({r["concurrency"] for r in rows}):
                ours = by.get((path, op, HEADLINE_SIZE, c))
                theirs = by.get((LMCACHE, op, HEADLINE_SIZE, c))
                suffix = ("" if op == "get" else "_put") + ("" if c == HEADLINE_CONCURRENCY else f"_c{c}")
                summary[f"{name}_vs_lmcache_throughput{suffix}"] = _ratio(ours, theirs)
    return summary


def serving_medians(records: list[Record]) -> dict[tuple[str, str, int], dict[str, float | None]]:
    """(phase, side, turn) -> median TTFT and prompt tokens over that turn of every conversation."""
    groups: dict[tuple[str, str, int], list[Record]] = {}
    for record in records:
        groups.setdefault((record["phase"], record["side"], record["turn"]), []).append(record)
    return {
        key: {
            "ttft_ms": _median([r["ttft_ms"] for r in group]),
            "prompt_tokens": _median([r["prompt_tokens"] for r in group]),
            "reused_tokens": _median([r["reused_tokens"] for r in group]) if key[1] == ATTNSTORE else None,
            "turns": len(group),
        }
        for key, group in sorted(groups.items())
    }


def later_turn_ttft(records: list[Record], phase: str, side: str) -> float | None:
    return _median(
        [
            r["ttft_ms"]
            for r in records
            if r["phase"] == phase and r["side"] == side and r["turn"] >= LATER_TURN
        ]
    )


def serving_summary(records: list[Record]) -> dict[str, Any]:
    """Later-turn TTFT ratios per phase, and the same for first turns (no history on either
    side: how the two engines' prefill compares, which the cache does not change)."""
    firsts = {
        side: _median([r["ttft_ms"] for r in records if r["side"] == side and r["turn"] == 1])
        for side in (ATTNSTORE, VLLM)
    }
    summary: dict[str, Any] = {"first_turn_ttft_vs_vllm": _ratio(firsts[ATTNSTORE], firsts[VLLM])}
    for phase, suffix in ((OVER, ""), (FITS, "_fits")):
        ours, theirs = later_turn_ttft(records, phase, ATTNSTORE), later_turn_ttft(records, phase, VLLM)
        summary[f"later_turn_ttft_vs_vllm{suffix}"] = _ratio(ours, theirs)
        summary[f"later_turn_median_ttft_ms{suffix}"] = {ATTNSTORE: ours, VLLM: theirs}
    summary["idle_wait_ms_after"] = idle_waits_after(records)
    return summary


def idle_waits_after(records: list[Record]) -> dict[str, float | None]:
    """Side -> median wait, before the next request, for the machine to go idle after that
    side's turns (records in the order they ran; bench/common/cpu_quiet.py)."""
    waits: dict[str, list[float]] = {ATTNSTORE: [], VLLM: []}
    for previous, record in itertools.pairwise(records):
        if "idle_wait_ms" in record:
            waits[previous["side"]].append(record["idle_wait_ms"])
    return {side: _median(values) for side, values in waits.items()}


def verdicts(summary: dict[str, Any]) -> tuple[dict[str, bool | None], list[str]]:
    """PASS/FAIL per target; None (and UNAVAILABLE) when the peer could not be measured."""
    checks = [
        (
            "daemon_vs_lmcache_throughput",
            ">=",
            THROUGHPUT_TARGET,
            "daemon Get throughput >= LMCache server's, gRPC vs LMCache's TCP protocol, 5.9 MB chunks",
        ),
        ("daemon_vs_lmcache_throughput_put", ">=", THROUGHPUT_TARGET, "the same for Put"),
        (
            "daemon_shm_vs_lmcache_throughput",
            ">=",
            THROUGHPUT_TARGET,
            "daemon Get over shared memory (a same-node worker's path) >= LMCache server's",
        ),
        ("daemon_shm_vs_lmcache_throughput_put", ">=", THROUGHPUT_TARGET, "the same for Put"),
        (
            "later_turn_ttft_vs_vllm",
            "<=",
            TTFT_TARGET,
            "median TTFT of turns >= 3, over vLLM's KV capacity: attnstore <= 0.5x vLLM",
        ),
    ]
    passed: dict[str, bool | None] = {}
    lines = []
    for name, sense, target, text in checks:
        value = summary.get(name)
        if value is None:
            passed[name] = None
            lines.append(f"UNAVAILABLE  {text}: {name} not measured")
            continue
        passed[name] = value >= target if sense == ">=" else value <= target
        lines.append(
            f"{'PASS' if passed[name] else 'FAIL'}  {text}: {name} = {value:.3f} (target {sense} {target:g})"
        )
    return passed, lines


def format_store_table(rows: list[Row]) -> str:
    header = f"{'path':<24} {'size':>6} {'conc':>4} {'op':<4} {'GB/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'vs LMCache':>10}"
    lines = [header, "-" * len(header)]
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["size"], r["op"], r["path"])):
        ratio = f"{r['vs_lmcache']:.2f}x" if r.get("vs_lmcache") is not None else "-"
        lines.append(
            f"{r['path']:<24} {r['size']:>6} {r['concurrency']:>4} {r['op']:<4} {r['gbps']:>7.3f} "
            f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {ratio:>10}"
        )
    return "\n".join(lines)


def format_serving_table(records: list[Record]) -> str:
    medians = serving_medians(records)
    header = (
        f"{'phase':<14} {'turn':>4} {'convs':>5} {'prompt tok vLLM/ours':>21} {'reused':>6} "
        f"{'TTFT ms vLLM':>12} {'TTFT ms ours':>12} {'ours/vLLM':>9}"
    )
    lines = [
        "medians over the conversations of each turn; reused = prompt tokens attnstore loaded from its store",
        header,
        "-" * len(header),
    ]
    keys = sorted({(phase, turn) for phase, _, turn in medians}, key=lambda k: (k[0] != FITS, k[1]))
    for phase, turn in keys:
        ours, theirs = medians.get((phase, ATTNSTORE, turn), {}), medians.get((phase, VLLM, turn), {})
        ratio = _ratio(ours.get("ttft_ms"), theirs.get("ttft_ms"))
        prompts = f"{_fmt(theirs.get('prompt_tokens'), '.0f')}/{_fmt(ours.get('prompt_tokens'), '.0f')}"
        lines.append(
            f"{phase:<14} {turn:>4} {ours.get('turns', theirs.get('turns', 0)):>5} {prompts:>21} "
            f"{_fmt(ours.get('reused_tokens'), '.0f'):>6} {_fmt(theirs.get('ttft_ms'), '.0f'):>12} "
            f"{_fmt(ours.get('ttft_ms'), '.0f'):>12} {_fmt(ratio, '.2f'):>9}"
        )
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
