"""The predictive policy end to end: an application's expected_next_turn_seconds on Chat
reaches the daemon as a prediction of the session's next use (scheduler with
hints.policy=predictive, daemon with eviction_policy=predictive, a real worker)."""

from __future__ import annotations

from pathlib import Path

from scheduler_stack import start_stack, wait_for
from service_probes import scrape_metrics


def predicted_within(metrics_port: int, seconds: float) -> float:
    """PREDICT hints the daemon received for a next use within `seconds` (a histogram bucket)."""
    return scrape_metrics(metrics_port).get(
        f'attnstore_kvstore_predicted_next_use_seconds_bucket{{le="{seconds}"}}', 0
    )


def test_the_applications_expectation_reaches_the_daemon_as_a_prediction(
    tmp_path: Path, scheduler_model_dir: Path
) -> None:
    stack = start_stack(
        tmp_path / "stack",
        scheduler_model_dir,
        redis=None,
        worker_nodes=("node-a",),
        scheduler_settings={"hints": {"policy": "predictive", "predict_interval_seconds": 0.2}},
        daemon_settings={"eviction_policy": "predictive", "metrics_port": 0},
    )
    metrics_port = stack.local.daemon.metrics_port
    assert metrics_port is not None
    try:
        client = stack.client()
        session = client.create_session(system_prompt="be brief")
        answer = client.chat(
            session.session_id,
            "tell me a story about a cache " * 4,
            max_tokens=40,
            expected_next_turn_seconds=20.0,
        )
        assert answer.stats is not None and answer.stats.prompt_tokens > 16  # at least one whole chunk stored
        # 10..30 s: the expectation. A session with a turn under way is predicted at 0 s, and
        # without the expectation one that just ended about 2 minutes away (the estimator's
        # prior: 60 s gaps, half of the sessions coming back).
        wait_for(
            lambda: predicted_within(metrics_port, 30.0) - predicted_within(metrics_port, 10.0) >= 1,
            what="the session predicted back in 10 to 30 s at the daemon",
        )
    finally:
        stack.close()
