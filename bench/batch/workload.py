"""bench-batch's inputs, all from ShareGPT (bench/common/sharegpt.py) in seeded order:

- the serving levels' dialogues (user messages; each system generates its own answers),
  a separate set of conversations per level so no level reuses another's KV;
- for the in-process memory measurements (memory.py), conversations as token ids the way
  a session holds them (chat template segments, the dataset's answers), optionally after
  a shared ~1,000-token system prompt cut from ShareGPT text.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from transformers import PreTrainedTokenizerBase

from bench.batch.memory import Request
from bench.common.sharegpt import read_sharegpt, seeded_chats, to_turns, token_segments
from bench.peers.workload import Dialogue, select_dialogues

T = TypeVar("T")


@dataclass(frozen=True)
class TokenConversation:
    system: list[int]  # the system prompt's template segment ([] when none is given)
    turns: list[Request]  # each turn's prompt (system + history + message) and the dataset's answer

    @property
    def tokens(self) -> list[int]:
        """The whole session after its last turn."""
        last = self.turns[-1]
        return last.prompt + last.answer


def level_dialogues(
    tokenizer: PreTrainedTokenizerBase, levels: list[int], *, turns: int, seed: int, max_message_tokens: int
) -> dict[int, list[Dialogue]]:
    """Concurrency level -> that many dialogues of `turns` user messages, none shared."""
    dialogues = select_dialogues(
        tokenizer,
        count=sum(levels),
        turns=turns,
        seed=seed,
        min_tokens=turns,
        max_tokens=turns * max_message_tokens,
        max_message_tokens=max_message_tokens,
    )
    return dict(zip(levels, consecutive_sets(dialogues, levels), strict=True))


def consecutive_sets(items: Sequence[T], counts: Sequence[int]) -> list[list[T]]:
    """`items` cut into consecutive runs of `counts` items each, in order."""
    starts = list(itertools.accumulate(counts, initial=0))
    return [list(items[start : start + count]) for start, count in zip(starts, counts, strict=False)]


def system_prompt_text(tokenizer: PreTrainedTokenizerBase, tokens: int, *, seed: int) -> str:
    """Real text whose chat-template system segment is about `tokens` long: ShareGPT answers
    (the seeded order's first ones) cut to length."""
    items = list(read_sharegpt())
    random.Random(seed + 1).shuffle(items)
    ids: list[int] = []
    for item in items:
        for message in item.get("conversations", []):
            if message.get("from") == "gpt":
                ids += tokenizer.encode(message.get("value", "") + "\n", add_special_tokens=False)
        if len(ids) > 2 * tokens:
            break
    text = tokenizer.decode(ids[:tokens])
    overhead = len(_system_segment(tokenizer, text)) - tokens  # the template's own tokens, re-tokenizing
    return tokenizer.decode(ids[: tokens - overhead])


def _system_segment(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return token_segments(tokenizer, [{"role": "system", "content": text}])[0]


def token_conversations(
    tokenizer: PreTrainedTokenizerBase,
    *,
    count: int,
    seed: int,
    system_prompt: str | None,
    max_turns: int,
    max_prompt_tokens: int,
    max_answer_tokens: int,
) -> list[TokenConversation]:
    """`count` conversations (seeded order) of at least two turns as token ids, each turn's
    prompt at most `max_prompt_tokens` after the system segment, answers cut to
    `max_answer_tokens`."""
    chosen: list[TokenConversation] = []
    for _, messages in seeded_chats(seed, min_messages=4):
        head = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        segments = token_segments(tokenizer, head + messages)
        system = segments[0] if head else []
        kept = to_turns(segments[len(head) :], max_turns=max_turns, max_prompt_tokens=max_prompt_tokens)
        if len(kept) < 2:
            continue
        chosen.append(
            TokenConversation(
                system, [Request(system + t.prompt, t.answer[:max_answer_tokens]) for t in kept]
            )
        )
        if len(chosen) == count:
            return chosen
    raise RuntimeError(f"only {len(chosen)} conversations fit")
