"""The OpenAI-compatible HTTP API of the scheduler (FastAPI on uvicorn, in the scheduler's
event loop): /v1/chat/completions, /v1/completions, /v1/models, /health and /metrics,
sharing the gRPC API's turn path, API keys, tenants and limits. docs/scheduler.md has the
rules (sessions through `X-Attnstore-Session`, stop texts, errors)."""
