"""Prometheus metrics of the OpenAI-compatible API (turn metrics are the scheduler's own,
labelled with kind openai_chat / openai_completion)."""

from __future__ import annotations

from prometheus_client import Counter

REQUESTS = Counter(
    "attnstore_openai_requests_total", "HTTP requests of the OpenAI-compatible API", ["route", "status"]
)
DISCONNECTS = Counter(
    "attnstore_openai_client_disconnects_total", "Requests whose client left before the answer ended"
)
