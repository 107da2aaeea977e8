"""A workload's perplexity served from modules against the full prefill's, as a corpus
quantity: exp of the mean NLL over every reference token of the workload (the same tokens
on both sides), with a bootstrap interval over the cases (the prompts, not the tokens: a
prompt's tokens move together)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.modules.measure import CaseResult

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95

Perplexity = Callable[[CaseResult], float]


@dataclass(frozen=True)
class CorpusDelta:
    delta: float  # the workload's perplexity over the full prefill's, less 1 (signed)
    low: float  # the bootstrap interval of `delta` (CONFIDENCE, percentiles)
    high: float


def _log_ratios(rows: Sequence[CaseResult], ppl: Perplexity) -> list[tuple[float, int]]:
    """Per case: (summed NLL difference over its reference, its reference tokens)."""
    pairs = []
    for r in rows:
        if r.reference_tokens is None:
            raise ValueError(f"row {r.label} has no reference_tokens (a run before it was recorded)")
        pairs.append((r.reference_tokens * math.log(ppl(r) / r.ppl_full), r.reference_tokens))
    return pairs


def _delta(pairs: Sequence[tuple[float, int]]) -> float:
    return math.exp(sum(nll for nll, _ in pairs) / sum(tokens for _, tokens in pairs)) - 1


def corpus_delta(rows: Sequence[CaseResult], ppl: Perplexity) -> float:
    """exp(NLL served from modules / reference tokens) over exp(NLL of the full prefill /
    the same tokens), less 1: a case's perplexity times its tokens is its NLL."""
    return _delta(_log_ratios(rows, ppl))


def corpus_interval(rows: Sequence[CaseResult], ppl: Perplexity) -> CorpusDelta:
    """`corpus_delta` and its percentile bootstrap interval over cases (seeded: the same rows
    give the same interval)."""
    pairs = _log_ratios(rows, ppl)
    rng = random.Random(BOOTSTRAP_SEED)
    deltas = sorted(_delta(rng.choices(pairs, k=len(pairs))) for _ in range(BOOTSTRAP_RESAMPLES))
    tail = (1 - CONFIDENCE) / 2
    return CorpusDelta(
        _delta(pairs),
        deltas[int(tail * BOOTSTRAP_RESAMPLES)],
        deltas[math.ceil((1 - tail) * BOOTSTRAP_RESAMPLES) - 1],
    )
