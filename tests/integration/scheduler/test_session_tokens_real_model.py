"""The session-token property of conversation_check.py on the real default model,
SmolLM2-135M-Instruct (its template writes a default system prompt when a conversation has
none), through a real scheduler, Redis, worker and daemon: every turn's history is the
rendered conversation and every greedy answer is transformers' `generate` on the rendered
prompt, for answers that end on the end-of-turn token and at max_tokens, sessions with and
without a system prompt, and Generate with one. Few turns and short answers: it stays cheap."""

from __future__ import annotations

from pathlib import Path

import pytest
from conversation_check import Conversation, Transcript, greedy
from scheduler_stack import Stack, StartStack
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from attnstore.api.v1 import api_pb2 as api
from inference_worker.decoding import stop_token_ids
from inference_worker.model_store import default_model_dir

pytestmark = pytest.mark.timeout(300)

SYSTEM = "You are a geography teacher. Answer in one short sentence."
TURNS = [  # (message, max_tokens)
    ("What is the capital of France?", 24),  # answered in a few tokens: ends on <|im_end|>
    ("Describe Paris in detail.", 6),  # cut at max_tokens
    ("And the capital of Italy?", 12),
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return default_model_dir()


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, list[int]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer, sorted(stop_token_ids(model, tokenizer))


@pytest.fixture(scope="module")
def stack(model_dir: Path, module_stacks: StartStack) -> Stack:
    return module_stacks(model_dir, worker_nodes=("node-a",), scheduler_settings={"max_session_tokens": 4000})


@pytest.mark.parametrize("system_prompt", ["", SYSTEM], ids=["default-system", "system"])
def test_every_turn_is_the_rendered_conversation(
    stack: Stack, reference: tuple[PreTrainedModel, PreTrainedTokenizerBase, list[int]], system_prompt: str
) -> None:
    model, tokenizer, stop_ids = reference
    assert stack.redis is not None
    chat = Conversation(
        stack.client(), stack.redis.url, model, stop_ids, Transcript(tokenizer, system_prompt)
    )
    for message, max_tokens in TURNS:
        chat.chat(message, max_tokens)
    finished = [turn.finish_reason for turn in chat.turns]
    assert finished[:2] == [api.FINISH_REASON_STOP, api.FINISH_REASON_LENGTH], finished
    assert all(chat.transcript.retokenizes(turn) for turn in chat.turns)  # so the whole history was compared


def test_generate_with_a_system_prompt_runs_the_rendered_prompt(
    stack: Stack, reference: tuple[PreTrainedModel, PreTrainedTokenizerBase, list[int]]
) -> None:
    model, tokenizer, stop_ids = reference
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURNS[2][0]}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    answer = stack.client().generate(TURNS[2][0], system_prompt=SYSTEM, max_tokens=16)
    assert list(answer.token_ids) == greedy(model, prompt, 16, stop_ids)
