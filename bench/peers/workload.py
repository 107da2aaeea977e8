"""The serving comparison's workload: real ShareGPT conversations (bench/common/sharegpt.py), as
the user messages an application would send turn after turn, and the order both servers
get them in.

Each side generates its own answers (greedy, a fixed max_tokens), so the history a turn
carries is the user messages plus that side's short answers: both sides see prompts of
the same length (the table shows their prompt tokens side by side). Conversations are
replayed round-robin (turn 1 of every conversation, then turn 2 of every one, ...), so all
of them are live at once and each turn's history has waited behind everyone else's.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from bench.common.sharegpt import seeded_chats


@dataclass(frozen=True)
class Dialogue:
    id: str
    messages: list[str]  # the user's messages, in order


@dataclass(frozen=True)
class Step:
    dialogue: int  # index into the run's dialogues
    turn: int  # 1-based


def select_dialogues(
    tokenizer: PreTrainedTokenizerBase,
    *,
    count: int,
    turns: int,
    seed: int,
    min_tokens: int,
    max_tokens: int,
    max_message_tokens: int,
    skip: int = 0,
) -> list[Dialogue]:
    """`count` conversations in seeded order, after the first `skip` that qualify, whose
    first `turns` user messages are each at most `max_message_tokens` and together
    `min_tokens`..`max_tokens` tokens (every one ends with a long history, none with a
    prompt past the model's context)."""
    chosen: list[Dialogue] = []
    for item, messages in seeded_chats(seed, min_messages=2 * turns):
        users = [m["content"] for m in messages[0 : 2 * turns : 2]]
        lengths = [len(tokenizer.encode(text, add_special_tokens=False)) for text in users]
        if max(lengths) > max_message_tokens or not min_tokens <= sum(lengths) <= max_tokens:
            continue
        if skip > 0:
            skip -= 1
            continue
        chosen.append(Dialogue(item["id"], users))
        if len(chosen) == count:
            return chosen
    raise RuntimeError(f"only {len(chosen)} ShareGPT conversations fit the limits")


def round_robin(dialogues: list[Dialogue], turns: int) -> list[Step]:
    return [Step(d, t) for t in range(1, turns + 1) for d in range(len(dialogues))]
