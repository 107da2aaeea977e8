"""The property a session's tokens must have (issue 17), checked from outside the scheduler:
a conversation driven through the public API against the chat template rendered by
transformers and greedy answers of transformers' `generate`.

`Conversation` drives one session; after each turn `check_history` reads the stored history
(the session record in Redis, decoded by the scheduler's own SessionRecord) and asserts:
- it is the template's rendering of the messages, token for token, except inside the
  answers, where it holds the generated ids (the end-of-turn token an answer stopped on is
  the template's closing, not content): every answer, however it ended, reads as closed;
  contents are plain text, even where they spell the template's control tokens;
- where every answer's ids are what the tokenizer gives for its text, it is exactly
  `apply_chat_template` of the messages;
- the answer is transformers' greedy `generate` on that turn's prompt (the rendering of the
  conversation and the new message with the same rule), so the worker ran that prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import redis
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AttnStoreClient
from attnstore_scheduler.session_record import SessionRecord

_CONTENT = "\x00content{}\x00"
_CONTENT_PATTERN = re.compile("\x00content(\\d+)\x00")


@dataclass(frozen=True)
class Turn:
    message: str
    answer_ids: list[int]  # as generated, a final stop token included
    answer_text: str
    finish_reason: int  # api.FinishReason


@dataclass
class Transcript:
    """A conversation as the test knows it, rendered as the session's history must be."""

    tokenizer: PreTrainedTokenizerBase
    system_prompt: str = ""
    turns: list[Turn] = field(default_factory=list)

    def messages(self, new_message: str | None = None) -> list[dict[str, str | int]]:
        """The conversation for the template; answers as their index (rendered by id)."""
        messages: list[dict[str, str | int]] = (
            [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        )
        for index, turn in enumerate(self.turns):
            messages += [{"role": "user", "content": turn.message}, {"role": "assistant", "content": index}]
        if new_message is not None:
            messages.append({"role": "user", "content": new_message})
        return messages

    def rendered(self, new_message: str | None = None) -> list[int]:
        """The template's rendering: its markup tokenized as transformers does, each text
        content as plain text (control-token spellings too), each answer's content its
        generated ids (a final stop token left out: the closing writes it)."""
        messages = self.messages(new_message)
        text = self.tokenizer.apply_chat_template(
            [{**m, "content": _CONTENT.format(index)} for index, m in enumerate(messages)],
            tokenize=False,
            add_generation_prompt=new_message is not None,
        )
        ids: list[int] = []
        for index, part in enumerate(_CONTENT_PATTERN.split(text)):
            if index % 2 == 0:
                ids += self.tokenizer(part, add_special_tokens=False)["input_ids"]
                continue
            content = messages[int(part)]["content"]
            if isinstance(content, int):
                ids += self.content_ids(self.turns[content])
            else:
                ids += self.tokenizer(content, add_special_tokens=False, split_special_tokens=True)[
                    "input_ids"
                ]
        return ids

    def content_ids(self, turn: Turn) -> list[int]:
        stopped = turn.finish_reason == api.FINISH_REASON_STOP  # on a stop token: the closing writes it
        return turn.answer_ids[:-1] if stopped else turn.answer_ids

    def retokenizes(self, turn: Turn) -> bool:
        return self.tokenizer(turn.answer_text, add_special_tokens=False)["input_ids"] == self.content_ids(
            turn
        )


@dataclass
class Conversation:
    """One session driven through the public API, checked after every turn."""

    client: AttnStoreClient
    redis_url: str
    model: PreTrainedModel
    stop_ids: list[int]
    transcript: Transcript
    tenant: str = "acme"
    session_id: str = ""

    def __post_init__(self) -> None:
        self.session_id = self.client.create_session(system_prompt=self.transcript.system_prompt).session_id

    @property
    def turns(self) -> list[Turn]:
        return self.transcript.turns

    def chat(self, message: str, max_tokens: int, *, stop_after: int | None = None) -> Turn:
        """One turn; `stop_after` = k: a stop string is chosen so that the answer ends on its
        k-th token (the text that token adds), as a client's stop text would end it."""
        prompt = self.transcript.rendered(message)
        expected = greedy(self.model, prompt, max_tokens, self.stop_ids)
        stop: list[str] = []
        if stop_after is not None:
            tokenizer = self.transcript.tokenizer
            before = tokenizer.decode(expected[: stop_after - 1], skip_special_tokens=True)
            whole = tokenizer.decode(expected[:stop_after], skip_special_tokens=True)
            assert whole.startswith(before) and len(whole) > len(before), "pick a token that adds text"
            stop = [whole[len(before) :]]
            assert stop[0] not in before, "the stop text must first appear at that token"
            expected = expected[:stop_after]
        answer = self.client.chat(self.session_id, message, max_tokens=max_tokens, stop=stop)
        turn = Turn(message, list(answer.token_ids), answer.text, answer.stats.finish_reason)
        self.turns.append(turn)
        assert turn.answer_ids == expected, (
            f"turn {len(self.turns)}: the worker's answer is not generate's on the rendered prompt"
        )
        self.check_history(answer.stats.history_tokens)
        return turn

    def stored(self) -> SessionRecord:
        data = redis.Redis.from_url(self.redis_url).get(f"attnstore:session:{self.tenant}:{self.session_id}")
        assert data is not None
        return SessionRecord.decode(data)

    def check_history(self, history_tokens: int) -> None:
        record = self.stored()
        assert list(record.token_ids) == self.transcript.rendered(), (
            "the history is not the template's rendering"
        )
        assert history_tokens == len(record.token_ids)
        if all(self.transcript.retokenizes(turn) for turn in self.turns):
            whole = self.transcript.tokenizer.apply_chat_template(
                [
                    {**m, "content": self.turns[m["content"]].answer_text} if m["role"] == "assistant" else m
                    for m in self.transcript.messages()
                ],
                add_generation_prompt=False,
                return_dict=False,
            )
            assert list(record.token_ids) == whole
        stored = self.client.get_session(self.session_id).messages
        answers = [m for m in stored if m.role == api.ROLE_ASSISTANT]
        assert [(m.content, m.finish_reason) for m in answers] == [
            (turn.answer_text, turn.finish_reason) for turn in self.turns
        ]


def simulate(
    model: PreTrainedModel, transcript: Transcript, plan: list[tuple[str, int]], stop_ids: list[int]
) -> None:
    """Plays `plan` (message, max_tokens) into `transcript` as the worker answers the rendered
    conversation, with transformers alone."""
    for message, max_tokens in plan:
        ids = greedy(model, transcript.rendered(message), max_tokens, stop_ids)
        stopped = bool(ids) and ids[-1] in stop_ids
        finish = api.FINISH_REASON_STOP if stopped else api.FINISH_REASON_LENGTH
        text = transcript.tokenizer.decode(ids[:-1] if stopped else ids)
        transcript.turns.append(Turn(message, ids, text, finish))


def greedy(model: PreTrainedModel, prompt: list[int], max_tokens: int, stop_ids: list[int]) -> list[int]:
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=stop_ids,
            pad_token_id=stop_ids[0],
        )
    return [int(token) for token in output[0, len(prompt) :]]
