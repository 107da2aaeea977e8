"""A word tokenizer and a chat template stand-in for the prompt-module tests: deterministic,
one token per whitespace-separated word, so positions can be counted by eye."""

from __future__ import annotations

import zlib


def word_tokens(text: str) -> list[int]:
    return [zlib.crc32(word.encode()) % 50_000 for word in text.split()]


def tag_template(role: str, content: str) -> str:
    """Like a chat template: `[user] content [/user]`, each frame one word."""
    return f" [{role}] {content} [/{role}] "
