"""bench-batch's arithmetic over one level's turns (pure: unit-tested): output tokens and
turns per second over the level's wall time, and percentiles of TTFT and of the gaps
between a turn's streamed tokens (inter-token latency)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class TurnRecord:
    """One turn as the client saw it, on time.perf_counter's clock."""

    session: int
    turn: int  # 1-based
    started: float  # request sent
    ended: float  # stream closed
    token_times: list[float] = field(default_factory=list)  # each streamed token's arrival
    prompt_tokens: int = 0
    output_tokens: int = 0  # the server's count (TurnStats / usage)

    @property
    def ttft_s(self) -> float:
        return (self.token_times[0] if self.token_times else self.ended) - self.started

    @property
    def gaps_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


def percentile_ms(values_s: Sequence[float], q: float) -> float | None:
    """The q-th percentile (numpy's linear interpolation) in milliseconds; None when empty."""
    return round(float(np.percentile(values_s, q)) * 1000, 2) if len(values_s) else None


def summarize_level(records: Sequence[TurnRecord]) -> dict[str, float | int | None]:
    """One (system, concurrency) cell: throughput over the wall time from the first request
    to the last stream's end, and latency percentiles over all its turns."""
    if not records:
        raise ValueError("a level without turns")
    wall = max(r.ended for r in records) - min(r.started for r in records)
    output = sum(r.output_tokens for r in records)
    ttfts = [r.ttft_s for r in records]
    gaps = [gap for r in records for gap in r.gaps_s]
    return {
        "turns": len(records),
        "output_tokens": output,
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(output / wall, 2),
        "turns_per_s": round(len(records) / wall, 3),
        "ttft_p50_ms": percentile_ms(ttfts, 50),
        "ttft_p99_ms": percentile_ms(ttfts, 99),
        "itl_p50_ms": percentile_ms(gaps, 50),
        "itl_p99_ms": percentile_ms(gaps, 99),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator rounded, None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)
