"""bench-modules' perplexity delta as a corpus quantity (corpus_perplexity.py): the workload's
perplexity over every reference token, served from modules over the full prefill's, and its
bootstrap interval over the prompts."""

from __future__ import annotations

import math

import pytest
import torch

from bench.modules.corpus_perplexity import corpus_delta, corpus_interval
from bench.modules.measure import CaseResult, perplexity


def case(label: str, ppl_full: float, ppl_modules: float, tokens: int | None) -> CaseResult:
    return CaseResult(
        workload="doc_qa",
        label=label,
        module_tokens=900,
        prompt_tokens=920,
        ttft_full_ms=1000.0,
        ttft_modules_ms=50.0,
        ppl_full=ppl_full,
        ppl_modules=ppl_modules,
        agree_no_repair=1.0,
        reference_tokens=tokens,
    )


def served(row: CaseResult) -> float:
    return row.ppl_modules


def test_identical_perplexities_give_zero_and_a_zero_interval() -> None:
    rows = [case(f"q{i}", ppl, ppl, 32 + i) for i, ppl in enumerate((3.0, 11.5, 40.2, 7.7))]
    found = corpus_interval(rows, served)
    assert corpus_delta(rows, served) == pytest.approx(0.0, abs=1e-12)
    assert (found.delta, found.low, found.high) == pytest.approx((0.0, 0.0, 0.0), abs=1e-12)


def test_a_known_nll_shift_gives_its_ratio_whatever_the_case_lengths() -> None:
    """Every reference token 0.05 nats less likely: the perplexity is e^0.05 times the full
    prefill's, in each case and so in the workload."""
    rows = [
        case(f"q{i}", ppl, ppl * math.exp(0.05), tokens)
        for i, (ppl, tokens) in enumerate(((3.0, 16), (11.5, 128), (40.2, 64)))
    ]
    found = corpus_interval(rows, served)
    assert found.delta == pytest.approx(math.exp(0.05) - 1)
    assert found.low == pytest.approx(found.delta) and found.high == pytest.approx(found.delta)


def test_cases_weigh_by_their_reference_tokens() -> None:
    """A 96-token case 10% worse and a 32-token one 10% better: the workload is worse (not the
    per-case mean of the ratios, 0)."""
    rows = [case("long", 10.0, 11.0, 96), case("short", 10.0, 9.0, 32)]
    expected = math.exp((96 * math.log(1.1) + 32 * math.log(0.9)) / 128) - 1
    assert corpus_delta(rows, served) == pytest.approx(expected)
    assert expected > 0.04


def test_it_is_the_perplexity_of_the_pooled_tokens() -> None:
    """From logits: the delta equals exp of the mean NLL over every case's tokens pooled,
    modules over full prefill, less 1."""
    generator = torch.Generator().manual_seed(0)
    rows, full_logits, module_logits, references = [], [], [], []
    for index, tokens in enumerate((8, 40, 21)):
        reference = torch.randint(0, 50, (tokens,), generator=generator).tolist()
        full = torch.randn(tokens, 50, generator=generator)
        modules = full + 0.7 * torch.randn(tokens, 50, generator=generator)
        rows.append(case(f"q{index}", perplexity(full, reference), perplexity(modules, reference), tokens))
        full_logits.append(full)
        module_logits.append(modules)
        references += reference
    pooled = perplexity(torch.cat(module_logits), references) / perplexity(torch.cat(full_logits), references)
    assert corpus_delta(rows, served) == pytest.approx(pooled - 1, rel=1e-5)


def test_the_interval_holds_the_estimate_and_is_reproducible() -> None:
    rows = [
        case(f"q{i}", 10.0, 10.0 * ratio, 64) for i, ratio in enumerate((0.9, 1.05, 0.97, 1.12, 0.95, 1.0))
    ]
    found = corpus_interval(rows, served)
    assert found.low < found.delta < found.high
    assert found.low >= 0.9 - 1 - 1e-9  # no resample is below its lowest case
    assert corpus_interval(rows, served) == found


def test_a_row_without_reference_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="reference_tokens"):
        corpus_delta([case("old", 10.0, 11.0, None)], served)
