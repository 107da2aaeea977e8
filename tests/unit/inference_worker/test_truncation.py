"""The context-overflow plan: the fewest whole chunks dropped after the sinks so that the
prompt and max_tokens fit, never fewer than the session already dropped; which tokens stay
and which stored chunks a truncated prompt may load; refusals with clear messages."""

from __future__ import annotations

import pytest

from attnstore.errors import InvalidArgument
from inference_worker.truncation import NO_TRUNCATION, ContextWindow, ContextWindowError, Truncation

WINDOW = ContextWindow(max_context_tokens=100, sink_tokens=4, chunk_tokens=16)


def test_a_prompt_that_fits_is_not_truncated() -> None:
    assert WINDOW.plan(prompt_tokens=90, max_tokens=10) == NO_TRUNCATION
    assert NO_TRUNCATION.kept(list(range(5))) == [0, 1, 2, 3, 4]
    assert NO_TRUNCATION.reusable_chunks(prompt_tokens=49, chunk_tokens=16) == [0, 1, 2]
    assert NO_TRUNCATION.reusable_chunks(prompt_tokens=48, chunk_tokens=16) == [0, 1]  # last token computed


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "dropped"),
    [
        (91, 10, 12),  # 1 token over: chunk 0's tail after the sinks goes (resume at 16)
        (102, 10, 12),  # 12 over: still chunk 0's tail
        (103, 10, 28),  # 13 over: chunk 1 too (resume at 32)
        (150, 20, 76),  # 70 over: resume at 80
    ],
)
def test_the_fewest_whole_chunks_are_dropped(prompt_tokens: int, max_tokens: int, dropped: int) -> None:
    truncation = WINDOW.plan(prompt_tokens, max_tokens)
    assert truncation == Truncation(sink_tokens=4, dropped_tokens=dropped)
    assert truncation.resume_at % 16 == 0
    kept = truncation.kept(list(range(prompt_tokens)))
    assert kept[:4] == [0, 1, 2, 3] and kept[4] == truncation.resume_at and kept[-1] == prompt_tokens - 1
    assert len(kept) + max_tokens <= WINDOW.max_context_tokens
    assert len(kept) + max_tokens > WINDOW.max_context_tokens - 16  # not one chunk more than needed


def test_truncation_never_shrinks_within_a_session() -> None:
    # The session already dropped 28 tokens; this prompt would need only 12 dropped, or none.
    assert WINDOW.plan(prompt_tokens=91, max_tokens=10, requested_tokens=28).dropped_tokens == 28
    assert WINDOW.plan(prompt_tokens=60, max_tokens=10, requested_tokens=28).dropped_tokens == 28
    # A request between chunk boundaries rounds up to one.
    assert WINDOW.plan(prompt_tokens=60, max_tokens=10, requested_tokens=13).dropped_tokens == 28
    # More overflow than the session dropped: more is dropped.
    assert WINDOW.plan(prompt_tokens=150, max_tokens=20, requested_tokens=28).dropped_tokens == 76


def test_kept_chunks_and_chunk_zero_for_the_sinks_are_reusable() -> None:
    truncation = Truncation(sink_tokens=4, dropped_tokens=28)  # resumes at chunk 2
    assert truncation.reusable_chunks(prompt_tokens=81, chunk_tokens=16) == [0, 2, 3, 4]
    assert truncation.reusable_chunks(prompt_tokens=40, chunk_tokens=16) == [0]  # only the sinks
    no_sinks = ContextWindow(max_context_tokens=100, sink_tokens=0, chunk_tokens=16)
    plan = no_sinks.plan(prompt_tokens=103, max_tokens=10)
    assert plan == Truncation(sink_tokens=0, dropped_tokens=16)  # chunk 0 goes whole
    assert plan.kept(list(range(103)))[0] == 16
    assert plan.reusable_chunks(prompt_tokens=103, chunk_tokens=16) == [1, 2, 3, 4, 5]


def test_a_prompt_that_cannot_fit_is_refused() -> None:
    with pytest.raises(
        InvalidArgument, match=r"plus max_tokens 95 does not fit the 100-token context window"
    ):
        WINDOW.plan(prompt_tokens=200, max_tokens=95)  # keeps 4 sinks + 8 tokens at least
    assert WINDOW.max_new_tokens == 80
    WINDOW.plan(prompt_tokens=192, max_tokens=80)  # the worst tail (16 tokens) still fits
    with pytest.raises(
        InvalidArgument, match=r"truncated_tokens is 200, but a prompt of 100 tokens can drop at most 92"
    ):
        WINDOW.plan(prompt_tokens=100, max_tokens=1, requested_tokens=200)
    with pytest.raises(InvalidArgument, match="can drop at most 0"):
        WINDOW.plan(prompt_tokens=16, max_tokens=1, requested_tokens=1)


@pytest.mark.parametrize(
    ("positions", "context", "sinks", "message"),
    [
        (512, 1024, 4, "beyond the model's 512 positions"),
        (512, None, 17, r"attention_sink_tokens is 17; it must lie in \[0, chunk_tokens = 16\]"),
        (512, None, -1, "attention_sink_tokens is -1"),
        (512, 20, 4, "max_context_tokens is 20; it must exceed attention_sink_tokens \\+ chunk_tokens = 20"),
    ],
)
def test_bad_context_settings_are_refused(
    positions: int, context: int | None, sinks: int, message: str
) -> None:
    with pytest.raises(ContextWindowError, match=message):
        ContextWindow.for_model(positions, context, sinks, chunk_tokens=16)


def test_the_window_defaults_to_the_models_positions() -> None:
    assert ContextWindow.for_model(512, None, 4, 16).max_context_tokens == 512
    assert ContextWindow.for_model(512, 300, 0, 16) == ContextWindow(300, 0, 16)
