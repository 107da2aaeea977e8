"""Admission of long turns: the scheduler admits a turn up to the longest context a worker
serves (DescribeModel.max_turn_context_tokens: its KV pool, or with peers its
long_context.max_context_tokens), counts a prompt past the window as truncated to it, and
refuses beyond with RESOURCE_EXHAUSTED naming both limits; a worker that reports none
(0) decides itself."""

from __future__ import annotations

import pytest

from attnstore.errors import ResourceExhausted
from attnstore_scheduler.validation import check_turn_context
from attnstore_scheduler.worker_types import ModelCard

MODEL = ModelCard(max_context_tokens=8192, max_turn_context_tokens=4096)


def test_a_turn_up_to_the_longest_context_is_admitted() -> None:
    check_turn_context(4000, 96, MODEL)  # beyond a small pool: the worker's peers hold the rest


def test_a_longer_turn_is_refused_by_name() -> None:
    with pytest.raises(ResourceExhausted, match="4097 tokens.*at most 4096.*long_context.max_context_tokens"):
        check_turn_context(4001, 96, MODEL)


def test_a_prompt_past_the_window_counts_as_truncated() -> None:
    roomy = ModelCard(max_context_tokens=8192, max_turn_context_tokens=8192)
    check_turn_context(100_000, 96, roomy)  # the worker truncates it to the window
    with pytest.raises(ResourceExhausted, match="8192 tokens"):
        check_turn_context(100_000, 96, MODEL)


def test_a_worker_reporting_no_limit_decides_itself() -> None:
    check_turn_context(100_000, 96, ModelCard(max_context_tokens=8192))
