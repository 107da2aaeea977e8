"""The one-line curl a started local stack prints: a chat completion through the
scheduler's OpenAI-compatible API, with the model it serves."""

from __future__ import annotations

import json
import shlex
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
