"""The public TurnStats built from what the worker reported (the scheduler's one mapping
of a turn's outcome to the API): a namespace the KV store refused, and how a history
stored as hidden states was restored, reach the client."""

from __future__ import annotations

import pytest

from attnstore.api.v1 import api_pb2
from attnstore.worker.v1 import worker_pb2
from attnstore_scheduler import worker_messages
from attnstore_scheduler.servicer import turn_stats
from attnstore_scheduler.turn_types import FinishReason, TurnOutcome


def _outcome(**worker_stats: object) -> TurnOutcome:
    fields = {
        "prompt_tokens": 40,
        "reused_tokens": 0,
        "generated_tokens": 4,
        "finish_reason": worker_pb2.FINISH_REASON_LENGTH,
    }
    stats = worker_pb2.TurnStats(**{**fields, **worker_stats})
    return TurnOutcome(
        stats=worker_messages.worker_stats(stats),
        prompt_token_ids=tuple(range(40)),
        token_ids=(1, 2, 3, 4),
        text="abcd",
        node="node-a",
        attempts=1,
        queue_wait_seconds=0.0,
        session_saved=True,
        closing_tokens=2,
    )


def test_a_refused_namespace_is_the_turns_kv_unavailable_reason() -> None:
    reason = "the store keeps at most a maximum of 1 namespaces (max_namespaces)"
    stats = turn_stats(_outcome(namespace_refused=reason), ttft_seconds=0.1)
    assert stats.kv_unavailable_reason == reason and stats.reused_tokens == 0


def test_a_registered_namespace_leaves_it_empty_and_counts_the_closing_in_the_history() -> None:
    stats = turn_stats(_outcome(), ttft_seconds=0.1)
    assert stats.kv_unavailable_reason == ""
    assert stats.history_tokens == 40 + 4 + 2 and stats.session_saved


def test_a_restore_from_hidden_states_reaches_the_client() -> None:
    stats = turn_stats(
        _outcome(restore_plan="r1h6k5", restore_recompute_ms=12.5, restore_hidden_ms=40.0, restore_kv_ms=3.0),
        ttft_seconds=0.1,
    )
    assert stats.restore_plan == "r1h6k5"
    assert (stats.restore_recompute_ms, stats.restore_hidden_ms, stats.restore_kv_ms) == (12.5, 40.0, 3.0)
    plain = turn_stats(_outcome(), ttft_seconds=0.1)
    assert plain.restore_plan == "" and plain.restore_hidden_ms == 0.0


@pytest.mark.parametrize("reason", worker_pb2.FinishReason.values())
def test_every_finish_reason_reaches_the_api_as_the_worker_said(reason: int) -> None:
    # The worker's value becomes the scheduler's FinishReason (which a session record stores)
    # and the public API's value again: a value common.proto gains needs a FinishReason too.
    samples = [worker_pb2.SampleStats(sample_index=0, generated_tokens=4, finish_reason=reason)]
    outcome = _outcome(finish_reason=reason, samples=samples)
    assert isinstance(outcome.stats.finish_reason, FinishReason)
    stats = turn_stats(outcome, ttft_seconds=0.1)
    assert stats.finish_reason == reason and [s.finish_reason for s in stats.samples] == [reason]
    assert api_pb2.FinishReason.Name(stats.finish_reason) == worker_pb2.FinishReason.Name(reason)
