"""The one-line curl a started local stack prints: a chat completion through the
scheduler's OpenAI-compatible API, with the model it serves."""

from __future__ import annotations

import json
import shlex
import socket
import urllib.request

_MODELS_TIMEOUT_SECONDS = 10.0


def curl_line(openai_url: str) -> str:
    """`openai_url`: the API's base URL (http://host:port/v1); the local stack needs no key."""
    with urllib.request.urlopen(f"{openai_url}/models", timeout=_MODELS_TIMEOUT_SECONDS) as reply:
        model = json.load(reply)["data"][0]["id"]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hello! Who are you?"}],
        "max_tokens": 32,
    }
    return (
        f"curl -s {openai_url}/chat/completions -H 'Content-Type: application/json' "
        f"-d {shlex.quote(json.dumps(body))}"
    )


def free_port() -> int:
    """A port free on loopback now, for the HTTP API's listen address (uvicorn takes an
    address, so the port is chosen here rather than by the server)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
